// Put into optuna-dashboard's pages by autotune serve (app.py): its buttons that write
// (create, rename, delete a study, edit a note, upload, fail a trial) are hidden, since
// the service refuses what they send, and a line says why.
(() => {
  const labels = /^(rename study|delete study|delete artifact|skip trial)$/i;
  const texts = /^(create|rename|delete|delete study|delete artifact|edit|save|submit|fail trial|upload|upload a new file|upload a new image)$/i;
  function hide() {
    for (const button of document.querySelectorAll("button:not([data-read-only])")) {
      const label = button.getAttribute("aria-label") || "";
      if (labels.test(label) || texts.test(button.textContent.trim())) {
        button.dataset.readOnly = "hidden";
        button.style.display = "none";
      }
    }
  }
  new MutationObserver(hide).observe(document.documentElement, {childList: true, subtree: true});
  addEventListener("DOMContentLoaded", () => {
    const note = document.createElement("div");
    note.id = "autotune-read-only";
    note.textContent = "Read-only here: jobs change the record (autotune serve).";
    note.style.cssText = "position:fixed;bottom:4px;right:8px;font:12px sans-serif;color:#555;" +
      "background:#fffe;padding:2px 6px;border-radius:4px;z-index:9999";
    document.body.appendChild(note);
  });
})();
