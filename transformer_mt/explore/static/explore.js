// tmt explore: ask the JSON API about one sentence and draw the answers. Every number shown comes from the API.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { translate: null, beam: null, attention: null, anatomy: null, hoverRow: null };

async function api(path, body) {
  // One request; a 4xx/5xx answer becomes an Error carrying the server's one-line message.
  const init = body === undefined ? {} : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new Error(`the tmt explore server does not answer (${err.message}); is it still running?`);
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${path}: HTTP ${response.status}`);
  return data;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => (k === "class" ? (node.className = v) : node.setAttribute(k, v)));
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(x, digits) {
  return Number(x).toFixed(digits === undefined ? 4 : digits);
}

function request() {
  const body = { text: $("source").value, checkpoint: $("checkpoint").value || null };
  if ($("beam").value !== "") body.beam = Number($("beam").value);
  if ($("lenpen").value !== "") body.lenpen = Number($("lenpen").value);
  if ($("tgt-lang").value !== "") body.tgt_lang = $("tgt-lang").value;
  return body;
}

function showLanguages(checkpoints) {
  // A multilingual checkpoint translates into the language chosen here (its tag starts the source); one with a single
  // target language, or none stated, needs no choice and the select stays hidden.
  const chosen = checkpoints.find((c) => c.name === $("checkpoint").value) || checkpoints[0];
  const languages = chosen.languages || [];
  fillSelect($("tgt-lang"), languages.length > 1 ? languages.map((l) => [l, l]) : []);
  $("tgt-lang-label").hidden = languages.length < 2;
}

// ---------------------------------------------------------------- translate: everything for one sentence
async function run() {
  const body = request();
  const reference = $("reference").value.trim() ? $("reference").value : null;
  const batchWith = $("batch-with").value.trim() ? $("batch-with").value : null;
  showError("");
  $("go").disabled = true;
  $("status").textContent = "translating...";
  try {
    const [tr, beam, att, anat] = await Promise.all([
      api("/api/translate", body),
      api("/api/beam", body),
      api("/api/attention", Object.assign({}, body, { reference })),
      api("/api/anatomy", Object.assign({}, body, { reference, batch_with: batchWith })),
    ]);
    Object.assign(state, { translate: tr, beam, attention: att, anatomy: anat });
    drawTranslation(tr);
    drawBeam(beam);
    drawAttentionControls(att);
    drawLoss(att);
    drawAnatomy(anat);
    $("status").textContent = `done in ${fmt(tr.time_ms + beam.time_ms + att.time_ms + anat.time_ms, 0)} ms of model time`;
  } catch (err) {
    showError(err.message);
    $("status").textContent = "";
  } finally {
    $("go").disabled = false;
  }
}

function drawTranslation(tr) {
  $("translation").textContent = tr.translation;
  const row = $("tokens");
  row.replaceChildren();
  tr.tokens.forEach((t, i) => {
    const chip = el("span", { class: "tok" + (t.in_output === false ? " not-output" : ""), "data-index": i }, showPiece(t.piece));
    chip.style.background = `rgba(45, 91, 215, ${0.1 + 0.6 * t.prob})`;
    chip.title = `p = ${fmt(t.prob)}`;
    chip.onmouseenter = () => focusTarget(i);
    row.appendChild(chip);
  });
  focusTarget(0);
}

function focusTarget(i) {
  // The alternatives of target position i, and its cross-attention (selected layer and head) shaded on the source.
  state.hoverRow = i;
  document.querySelectorAll("#tokens .tok").forEach((c) => c.classList.toggle("active", Number(c.dataset.index) === i));
  const t = state.translate && state.translate.tokens[i];
  const table = $("alternatives");
  table.replaceChildren();
  if (t) {
    $("alternatives-caption").textContent = `position ${i}: "${showPiece(t.piece)}", p = ${fmt(t.prob)}; the most probable pieces there:`;
    t.alternatives.forEach((a) => {
      const tr = el("tr", a.id === t.id ? { class: "winner" } : {});
      tr.append(el("td", {}, showPiece(a.piece)), el("td", { class: "num" }, fmt(a.prob)));
      table.appendChild(tr);
    });
  }
  shadeSource(i);
}

function shadeSource(i) {
  const att = state.attention, row = $("src-highlight");
  row.replaceChildren();
  if (!att) return;
  const layer = Number($("att-layer").value || 0), head = $("att-head").value;
  const heads = att.cross[Math.min(layer, att.cross.length - 1)];
  const weights = head === "mean" || head === "" ? headMean(heads)[i] : heads[Number(head)][i];
  if (!weights) return;
  const top = Math.max(...weights);
  att.src_pieces.forEach((p, k) => {
    const chip = el("span", { class: "tok", "data-weight": weights[k] }, showPiece(p));
    chip.style.background = `rgba(228, 87, 46, ${weights[k] / top})`;
    chip.title = `cross-attention ${fmt(weights[k])}`;
    row.appendChild(chip);
  });
}

function drawLoss(att) {
  $("loss-view").hidden = !att.teacher_forced;
  if (!att.teacher_forced) return;
  $("mean-loss").textContent = `mean loss ${fmt(att.mean_loss)} nats per piece (perplexity ${fmt(Math.exp(att.mean_loss), 2)})`;
  const box = $("loss");
  box.replaceChildren();
  const top = Math.max(...att.tokens.map((t) => t.loss), 1e-6);
  att.tokens.forEach((t) => {
    const bar = el("div", { class: "bar" });
    const fill = el("span", { class: "fill" });
    fill.style.width = `${(200 * t.loss) / top}px`;
    bar.append(el("code", {}, showPiece(t.piece)), fill, el("span", {}, `${fmt(t.loss)} (p ${fmt(t.prob)})`));
    box.appendChild(bar);
  });
}

// ---------------------------------------------------------------- beam search
function drawBeam(beam) {
  const slider = $("beam-slider");
  slider.max = Math.max(0, beam.steps.length - 1);
  slider.value = slider.max;
  slider.disabled = beam.steps.length === 0;
  drawBeamStep();
  const last = beam.steps.length ? beam.steps[beam.steps.length - 1].finished[0] : null;
  // the best finished hypothesis of the last step, its pieces joined as sentencepiece does (U+2581 = a space)
  $("beam-final").textContent = last ? last.tokens.join("").replace(/\u2581/g, " ").trim() : beam.translation;
  $("beam-why").textContent = `why: ${beam.winner.why}`;
}

function drawBeamStep() {
  const beam = state.beam;
  const step = beam && beam.steps[Number($("beam-slider").value)];
  const open = $("beam-open"), fin = $("beam-finished");
  open.replaceChildren();
  fin.replaceChildren();
  if (!step) {
    $("beam-step-label").textContent = beam ? "greedy search (beam 1): nothing to trace" : "";
    $("beam-reason").textContent = "";
    return;
  }
  $("beam-step-label").textContent = `step ${step.step + 1} of ${beam.steps.length} (hypotheses of ${step.length} pieces)`;
  open.appendChild(header(["beam", "from", "hypothesis", "log-prob"]));
  step.open.forEach((h, j) => open.appendChild(cells([j, h.from_beam, h.tokens.map(showPiece).join(" "), fmt(h.logprob)])));
  fin.appendChild(header(["hypothesis", "log-prob", "length", "lp", "score"]));
  step.finished.forEach((h) => {
    const tr = cells([h.tokens.map(showPiece).join(" ") + (h.eos ? " </s>" : " (cut)"), fmt(h.logprob), h.length, fmt(h.penalty), fmt(h.score)]);
    if (h.new) tr.className = "new";
    fin.appendChild(tr);
  });
  $("beam-reason").textContent = step.reason;
}

function header(names) {
  const tr = el("tr");
  names.forEach((n) => tr.appendChild(el("th", {}, n)));
  return tr;
}

function cells(values) {
  const tr = el("tr");
  values.forEach((v) => tr.appendChild(el("td", typeof v === "number" || /^-?\d/.test(v) ? { class: "num" } : {}, String(v))));
  return tr;
}

// ---------------------------------------------------------------- attention
const QUERY_KEYS = { encoder_self: ["src_pieces", "src_pieces"], decoder_self: ["tgt_out_pieces", "tgt_in_pieces"], cross: ["tgt_out_pieces", "src_pieces"] };

function drawAttentionControls(att) {
  const kind = $("att-kind").value;
  const layers = kind === "encoder_self" ? att.encoder_layers : att.decoder_layers;
  fillSelect($("att-layer"), layers.map((l, i) => [i, `layer ${l}`]));
  fillSelect($("att-head"), [...att.heads.map((h, i) => [i, `head ${h}`]), ["mean", "mean of heads"]]);
  drawAttention();
}

function fillSelect(select, options) {
  const keep = select.value;
  select.replaceChildren(...options.map(([v, label]) => el("option", { value: v }, label)));
  if (options.some(([v]) => String(v) === keep)) select.value = keep;
}

function attentionPanel(kind, layer, head) {
  const heads = state.attention[kind][layer];
  return head === "mean" ? headMean(heads) : heads[Number(head)];
}

function drawAttention() {
  const att = state.attention;
  if (!att) return;
  const kind = $("att-kind").value, layer = Number($("att-layer").value), head = $("att-head").value;
  const [qk, kk] = QUERY_KEYS[kind];
  const thumbs = $("att-thumbs");
  thumbs.replaceChildren();
  [...att.heads.map((_, i) => String(i)), "mean"].forEach((h) => {
    const fig = el("figure", h === head ? { class: "selected" } : {});
    const canvas = el("canvas");
    drawHeatmap(canvas, attentionPanel(kind, layer, h), { cell: 4, maxSize: 120 });
    fig.append(canvas, el("figcaption", {}, h === "mean" ? "mean" : `head ${att.heads[Number(h)]}`));
    fig.onclick = () => { $("att-head").value = h; drawAttention(); };
    thumbs.appendChild(fig);
  });
  const rows = attentionPanel(kind, layer, head);
  const q = att[qk], k = att[kk];
  drawHeatmap($("heatmap"), rows, {
    rowLabels: q,
    colLabels: k,
    onHover: (r, c, v) => {
      $("hover").textContent = `${showPiece(q[r])} \u2192 ${showPiece(k[c])}: ${fmt(v)}`;
      $("hover").dataset.value = v;
      if (kind !== "encoder_self") focusTarget(r);
    },
  });
  shadeSource(state.hoverRow || 0);
}

// ---------------------------------------------------------------- masks, shapes, positions
function maskTable(rows, rowLabels, colLabels, cellText) {
  // rows: (R, C) booleans; on = True. cellText(r, c, v): what a cell says.
  const table = el("table", { class: "mask" });
  const head = el("tr");
  head.appendChild(el("th"));
  colLabels.forEach((l) => head.appendChild(el("th", { class: "col" }, showPiece(l))));
  table.appendChild(head);
  rows.forEach((row, r) => {
    const tr = el("tr");
    tr.appendChild(el("th", {}, showPiece(rowLabels[r])));
    row.forEach((v, c) => tr.appendChild(el("td", { class: v ? "on" : "off", title: String(v) }, cellText(r, c, v))));
    table.appendChild(tr);
  });
  return table;
}

function drawAnatomy(anat) {
  const b = anat.batch, h = anat.heads;
  $("batch-shape").textContent = `batch B=${b.B}, source S=${b.S}, target T=${b.T} (BOS + pieces); d_model ${h.d_model}, ${h.H} heads of Dk=${h.Dk}, Dv=${h.Dv}`;
  const positions = anat.src_pieces[0].map((_, i) => String(i));
  const sentences = anat.src_pieces.map((_, i) => `sentence ${i}`);
  $("mask-src").replaceChildren(maskTable(anat.masks.src_pad, sentences, positions, (r, c) => showPiece(anat.src_pieces[r][c])));
  const tgt = anat.tgt_in_pieces[0];
  $("mask-dec").replaceChildren(maskTable(anat.masks.decoder_allowed[0], tgt, tgt, (r, c, v) => (v ? "\u2713" : "")));
  drawShapes();
  const pe = anat.positions;
  $("pe-caption").textContent = `${pe.kind} positions${pe.layout ? " (" + pe.layout + ")" : ""}: the vectors added at positions 0..${pe.n - 1}, ${pe.d_model} dimensions across`;
  drawHeatmap($("pe"), pe.table, {
    rowLabels: pe.table.map((_, i) => String(i)),
    vmin: -1,
    vmax: 1,
    diverging: true,
    cell: Math.max(2, Math.min(12, Math.floor(900 / pe.d_model))),
    onHover: (r, c, v) => ($("pe-hover").textContent = `position ${r}, dimension ${c}: ${fmt(v)}`),
  });
}

function drawShapes() {
  const anat = state.anatomy, table = $("shapes");
  if (!anat) return;
  const all = $("shapes-all").checked;
  table.replaceChildren(header(["module", "type", "shapes (in -> out)"]));
  anat.modules
    .filter((m) => all || m.details.length)
    .forEach((m) => {
      const tr = cells([m.name, m.type, m.shapes.join("; ")]);
      if (m.details.length) tr.lastChild.appendChild(el("pre", {}, m.details.join("\n")));
      table.appendChild(tr);
    });
}

// ---------------------------------------------------------------- start-up
async function start() {
  try {
    const [info, examples] = await Promise.all([api("/api/checkpoints"), api("/api/examples")]);
    fillSelect($("checkpoint"), info.checkpoints.map((c) => [c.name, `${c.name} (${c.encoder_layers}+${c.decoder_layers} layers, d_model ${c.d_model}, ${c.heads} heads)`]));
    $("checkpoint").value = info.default;
    showLanguages(info.checkpoints);
    $("checkpoint").onchange = () => {
      showLanguages(info.checkpoints);
      if ($("source").value.trim()) run();
    };
    const first = info.checkpoints[0];
    $("beam").value = first.decode.beam;
    $("lenpen").value = first.decode.lenpen;
    examples.sentences.forEach((s, i) => $("example").appendChild(el("option", { value: i }, s)));
    $("example").options[0].textContent = examples.sentences.length ? `(pick one of ${examples.sentences.length} sentences of ${examples.file})` : "(no example file)";
    $("example").onchange = () => {
      if ($("example").value === "") return;
      $("source").value = examples.sentences[Number($("example").value)];
      run();
    };
  } catch (err) {
    showError(err.message);
  }
  $("go").onclick = run;
  ["source", "reference", "batch-with"].forEach((id) => $(id).addEventListener("keydown", (ev) => { if (ev.key === "Enter") run(); }));
  $("tgt-lang").onchange = () => { if ($("source").value.trim()) run(); };
  $("beam-slider").oninput = drawBeamStep;
  $("att-kind").onchange = () => state.attention && drawAttentionControls(state.attention);
  $("att-layer").onchange = drawAttention;
  $("att-head").onchange = drawAttention;
  $("shapes-all").onchange = drawShapes;
}

start();
