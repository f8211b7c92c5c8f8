"use strict";
// The control panel's clone form (loaded before panel.js, which owns `state` and sends the
// op): a field per knob of the parent, a knob that holds a config object field by field
// (`peft_config.r`, `peft_config.lora_alpha`: the dotted names an op takes), a number input
// for a number; the fields a tag may never change shown locked, with the reason the server's
// check gives. Only the fields changed are sent.

function isNumberText(text) {
  return typeof text === "string" && text.trim() !== "" && Number.isFinite(Number(text));
}

async function openClone(run) {
  state.cloneOf = run;
  // A run tracked before the rapidfire.knobs tag has all its config as params: its form
  // offers the knobs that differ only.
  const names = [...new Set([...(run.tagged ? Object.keys(run.params) : []), ...state.knobs,
    ...("learning_rate" in run.params ? ["learning_rate"] : [])])].slice(0, 200);
  let refused = {};
  try {
    const reply = await call(PANEL_API + "clone-fields", {fields: names});
    refused = Object.fromEntries((reply.fields || []).map((f) => [f.name, f.refused]));
  } catch (e) { message(`the clone form could not check its fields: ${e.message}`); }
  // A config object's whole text (when its fields are given one by one too) is not a field.
  const whole = new Set(names.filter((n) => names.some((m) => m.startsWith(`${n}.`))));
  state.cloneFields = names.filter((n) => !whole.has(n)).map((name) => {
    const value = run.params[name] ?? "";
    return {name, value, number: isNumberText(value), refused: refused[name] || null};
  });
  document.getElementById("clone-title").textContent = `Clone ${run.name}`;
  document.getElementById("clone-fields").replaceChildren(...state.cloneFields.map((f) =>
    el("tr", {},
      el("td", {className: "field-name", text: f.name}),
      el("td", {}, el("input", {value: f.value, "data-field": f.name, "aria-label": f.name,
        type: f.number ? "number" : "text", step: f.number ? "any" : undefined,
        disabled: Boolean(f.refused)})),
      el("td", {className: "locked", text: f.refused ? `locked: ${f.refused}` : ""}))));
  document.getElementById("extra-name").value = "";
  document.getElementById("extra-value").value = "";
  document.getElementById("clone-warm").checked = false;
  document.getElementById("clone-form").hidden = false;
  document.getElementById("clone-form").scrollIntoView({block: "nearest"});
}

function parsed(text) {
  try { return JSON.parse(text); } catch (e) { return text; }
}

function sendClone() {
  const run = state.cloneOf;
  if (!run) return;
  const overrides = {};
  for (const input of document.querySelectorAll("#clone-fields input")) {
    const field = state.cloneFields.find((f) => f.name === input.dataset.field);
    if (!field || field.refused || input.value === field.value) continue;
    if (field.number && Number(input.value) === Number(field.value)) continue;  // 1e-3 = 0.001
    overrides[field.name] = field.number && isNumberText(input.value) ? Number(input.value)
      : parsed(input.value);
  }
  const extra = document.getElementById("extra-name").value.trim();
  if (extra) overrides[extra] = parsed(document.getElementById("extra-value").value);
  const verb = document.getElementById("clone-warm").checked ? "clone-warm" : "clone";
  document.getElementById("clone-form").hidden = true;
  state.cloneOf = null;
  sendOp(run, `${verb} ${JSON.stringify(overrides)}`);
}

function setUpClone() {
  document.getElementById("clone-send").addEventListener("click", sendClone);
  document.getElementById("clone-cancel").addEventListener("click", () => {
    document.getElementById("clone-form").hidden = true;
    state.cloneOf = null;
  });
}
