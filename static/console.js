// agentbay console: live parts over server-sent events, and a tenant
// switcher that submits itself. Every page works without this file.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("[data-live]")) {
    const source = new EventSource(el.dataset.live);
    source.addEventListener("html", (event) => {
      // Keep a form the user is typing in: do not replace it under them.
      const active = document.activeElement;
      if (active && el.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName) && active.value) {
        return;
      }
      el.innerHTML = event.data;
      el.dataset.updated = new Date().toISOString();
    });
    source.addEventListener("end", () => source.close());
  }
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
});
