// agentbay console: live parts over server-sent events, and a tenant
// switcher that submits itself. Every page works without this file.
"use strict";

// Times in UTC also in the reader's zone.
function localTimes(root) {
  for (const t of root.querySelectorAll("time.local[datetime]")) {
    if (t.dataset.local) continue;
    const at = new Date(t.getAttribute("datetime"));
    if (Number.isNaN(at.getTime())) continue;
    t.dataset.local = "1";
    t.textContent += " (" + at.toLocaleString() + " local)";
  }
}

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
    button.textContent = "⧉";
    button.addEventListener("click", async () => {
      await navigator.clipboard.writeText(el.dataset.copy);
      button.textContent = "✓";
      setTimeout(() => { button.textContent = "⧉"; }, 1200);
    });
    el.after(button);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  copyButtons(document);
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
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
});
