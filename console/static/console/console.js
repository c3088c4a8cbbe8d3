// Notices for background requests that fail. A file of its own, not hx-on attributes: the
// Content-Security-Policy allows no inline script and no eval.
(function () {
  "use strict";
  function notice(text) {
    var box = document.getElementById("live-notice");
    if (box) { box.textContent = text; }
  }
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail && event.detail.xhr ? event.detail.xhr.status : "?";
    notice("The console could not complete that request (status " + status + "). Reload the page to see the current state.");
  });
  document.addEventListener("htmx:sendError", function () {
    notice("The console could not be reached. Check your connection and reload the page.");
  });
})();
