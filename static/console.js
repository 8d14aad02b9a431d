// agentbay console: live parts over server-sent events, and a tenant
// switcher that submits itself. Every page works without this file.
"use strict";

// How long ago (or ahead) a time is, in the largest unit that reads well.
function relative(at) {
  const seconds = Math.round((Date.now() - at.getTime()) / 1000);
  const a = Math.abs(seconds);
  const [n, unit] = a < 90 ? [a, "s"] : a < 5400 ? [Math.round(a / 60), "min"]
    : a < 172800 ? [Math.round(a / 3600), "h"] : [Math.round(a / 86400), "d"];
  return seconds >= 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}

// Times: how long ago, the exact time (UTC and the reader's zone) on hover.
// Without JavaScript the exact UTC time stays.
function localTimes(root) {
  for (const t of root.querySelectorAll("time.local[datetime]")) {
    if (t.dataset.local) continue;
    const at = new Date(t.getAttribute("datetime"));
    if (Number.isNaN(at.getTime())) continue;
    t.dataset.local = "1";
    t.title = `${t.textContent.trim()} (${at.toLocaleString()} local)`;
    t.textContent = relative(at);
  }
}

// The copy icon drawn as SVG (two overlapping sheets) and a check mark:
// no font on the operator's machine needs to hold a glyph for them.
function icon(path) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "12");
  svg.setAttribute("height", "12");
  svg.setAttribute("aria-hidden", "true");
  const p = document.createElementNS(ns, "path");
  p.setAttribute("d", path);
  p.setAttribute("fill", "none");
  p.setAttribute("stroke", "currentColor");
  p.setAttribute("stroke-width", "1.5");
  svg.append(p);
  return svg;
}
const COPY_ICON = "M5.5 5.5h8v8h-8z M10.5 5.5v-3h-8v8h3";
const COPIED_ICON = "M3 8.5l3 3 7-7";

// A copy button after every whole id an element carries.
function copyButtons(root) {
  if (!navigator.clipboard) return;
  for (const el of root.querySelectorAll("[data-copy]")) {
    if (el.dataset.copyReady) continue;
    el.dataset.copyReady = "1";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.title = `copy ${el.dataset.copy}`;
    button.setAttribute("aria-label", `copy ${el.dataset.copy}`);
    button.replaceChildren(icon(COPY_ICON));
    button.addEventListener("click", async () => {
      await navigator.clipboard.writeText(el.dataset.copy);
      button.replaceChildren(icon(COPIED_ICON));
      setTimeout(() => { button.replaceChildren(icon(COPY_ICON)); }, 1200);
    });
    el.after(button);
  }
}

// A refused form comes back with what was typed. On submit, a form's
// visible fields are kept for this tab until the next page; when that page
// reports a refusal, they are put back into the same form and the reason
// is shown beside the field it names (or at the end of the form). Never a
// password; the copy is dropped as soon as the next page reads it.
const KEPT = "agentbay.form";

function keepOnSubmit(event) {
  const form = event.target;
  if (!(form instanceof HTMLFormElement) || (form.getAttribute("method") || "").toLowerCase() !== "post") return;
  const fields = {};
  for (const el of form.elements) {
    if (!el.name || el.tagName === "BUTTON" || ["hidden", "password", "submit", "file"].includes(el.type)) continue;
    fields[el.name + "\u0000" + (el.type === "checkbox" || el.type === "radio" ? el.value : "")] =
      el.type === "checkbox" || el.type === "radio" ? el.checked : el.value;
  }
  try {
    sessionStorage.setItem(KEPT, JSON.stringify({ path: location.pathname, action: form.getAttribute("action"), fields }));
  } catch (_) { /* storage off: nothing is kept */ }
}

function restoreRefusedForm() {
  let kept = null;
  try {
    kept = JSON.parse(sessionStorage.getItem(KEPT) || "null");
    sessionStorage.removeItem(KEPT);
  } catch (_) {
    return;
  }
  const flash = document.querySelector("p.flash.bad");
  if (!kept || !flash || kept.path !== location.pathname) return;
  const form = [...document.forms].find((f) => f.getAttribute("action") === kept.action);
  if (!form) return;
  for (const el of form.elements) {
    if (!el.name || el.tagName === "BUTTON" || ["hidden", "password", "submit", "file"].includes(el.type)) continue;
    const check = el.type === "checkbox" || el.type === "radio";
    const value = kept.fields[el.name + "\u0000" + (check ? el.value : "")];
    if (value === undefined) continue;
    if (check) el.checked = value;
    else el.value = value;
  }
  const note = document.createElement("span");
  note.className = "field-error";
  note.setAttribute("role", "alert");
  note.textContent = flash.textContent;
  const named = flash.dataset.field ? form.elements.namedItem(flash.dataset.field) : null;
  const input = named instanceof Element ? named : null;
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.after(note);
    input.focus();
  } else {
    form.append(note);
    const first = [...form.elements].find((el) => /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName) && el.type !== "hidden");
    if (first) first.focus();
  }
}

// A model turn as it is written: the text pieces of each call appended
// to its own block, a superseded try's block removed (the call is tried
// again as another), the stream resumed where it was after a reconnect
// (EventSource sends the last id it had).
function followText(panel) {
  const turns = panel.querySelector(".turns");
  const empty = panel.querySelector(".empty");
  const source = new EventSource(panel.dataset.text);
  const block = (call) => {
    let pre = turns.querySelector(`pre[data-call="${CSS.escape(call)}"]`);
    if (!pre) {
      pre = document.createElement("pre");
      pre.className = "turn";
      pre.dataset.call = call;
      turns.append(pre);
    }
    return pre;
  };
  source.addEventListener("text", (event) => {
    const piece = JSON.parse(event.data);
    const pre = block(piece.callId);
    pre.textContent += piece.text;
    pre.classList.add("writing");
    if (empty) empty.hidden = true;
  });
  source.addEventListener("ended", (event) => {
    const piece = JSON.parse(event.data);
    const pre = turns.querySelector(`pre[data-call="${CSS.escape(piece.callId)}"]`);
    if (pre) pre.classList.remove("writing");
  });
  source.addEventListener("superseded", (event) => {
    const piece = JSON.parse(event.data);
    const pre = turns.querySelector(`pre[data-call="${CSS.escape(piece.callId)}"]`);
    if (pre) pre.remove();
  });
  source.addEventListener("end", () => source.close());
}

document.addEventListener("submit", keepOnSubmit, true);

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  copyButtons(document);
  restoreRefusedForm();
  for (const el of document.querySelectorAll("[data-live]")) {
    const source = new EventSource(el.dataset.live);
    source.addEventListener("html", (event) => {
      // Keep a form the user is typing in: do not replace it under them.
      const active = document.activeElement;
      if (active && el.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.value) {
        return;
      }
      // Keep what the reader opened open.
      const open = [...el.querySelectorAll("details[open][id]")].map((d) => d.id);
      el.innerHTML = event.data;
      for (const id of open) {
        const d = document.getElementById(id);
        if (d) d.open = true;
      }
      localTimes(el);
      copyButtons(el);
      el.dataset.updated = new Date().toISOString();
    });
    source.addEventListener("end", () => source.close());
  }
  for (const panel of document.querySelectorAll("[data-text]")) followText(panel);
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
});
