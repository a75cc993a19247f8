// busscrape console: refresh the live parts of a page (elements with data-live-part and an id)
// from the same URL every few seconds. The new parts come from the server's own escaped HTML,
// parsed inertly (DOMParser runs no script) and moved in as nodes; nothing here builds markup.
"use strict";
(function () {
  const every = Number(document.body.dataset.live || 0);
  if (!every) return;
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, {credentials: "same-origin", cache: "no-store",
                                                          headers: {"Accept": "text/html"}});
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const part of document.querySelectorAll("[data-live-part][id]")) {
        const next = fresh.getElementById(part.id);
        if (next) part.replaceWith(document.importNode(next, true));
      }
      document.body.dataset.refreshed = String(Date.now());
    } catch (error) {
      // The server stopping or the network dropping: keep the last view, try again later.
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, every);
})();
