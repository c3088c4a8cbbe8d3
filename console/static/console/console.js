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
    // No status code for people: it is in the browser's console for whoever needs it.
    if (window.console) { window.console.warn("request failed with status", status); }
    notice("The console could not complete that request. Reload the page to see the current state.");
  });
  document.addEventListener("htmx:sendError", function () {
    notice("The console could not be reached. Check your connection and reload the page.");
  });

  // In DEBUG, django-htmx's script (a listener on document) replaces the whole page with any
  // 400 or 403 answer, to show Django's error pages. A refusal is no error page: it is the card
  // or row that says why, and htmx's responseHandling (the htmx-config in base.html) swaps it in
  // place. So refusals stop here, on the root element, before they reach that listener; a 500
  // goes on and DEBUG still shows its error page.
  var REFUSALS = [400, 403, 409];
  document.documentElement.addEventListener("htmx:beforeOnLoad", function (event) {
    var xhr = event.detail && event.detail.xhr;
    if (xhr && REFUSALS.indexOf(xhr.status) !== -1) { event.stopPropagation(); }
  });

  // A toast when an action the page follows has become final (the server sends HX-Trigger
  // consoleToast with {level, text}). It stays a few seconds, and can be closed.
  document.body.addEventListener("consoleToast", function (event) {
    var box = document.getElementById("toasts");
    var detail = event.detail || {};
    if (!box || !detail.text) { return; }
    var toast = document.createElement("p");
    toast.className = "toast toast--" + (detail.level || "info");
    toast.textContent = detail.text;
    box.appendChild(toast);
    setTimeout(function () { toast.remove(); }, 8000);
  });

  // A region that refreshes itself (data-pause-while-choosing, the review queue) skips its
  // refresh while a person is choosing in it: a select or field in it has the focus, or holds
  // a change not yet submitted. Otherwise the refresh would reset a half-chosen reassignment
  // and take the focus away. Only the region's own requests are held; its forms still post.
  // A control the person has touched counts as a choice in progress even when the value they
  // picked is the one shown first (a select with no preselected option shows its first).
  document.addEventListener("change", function (event) {
    var control = event.target;
    if (control && control.closest && control.closest("[data-pause-while-choosing]")) {
      control.setAttribute("data-chosen", "");
    }
  });
  function changedControl(control) {
    if (control.type === "hidden" || control.disabled) { return false; }
    if (control.hasAttribute("data-chosen")) { return true; }
    if (control.tagName === "SELECT") {
      var defaultIndex = 0;
      for (var i = 0; i < control.options.length; i++) {
        if (control.options[i].defaultSelected) { defaultIndex = i; break; }
      }
      return control.options.length > 0 && control.selectedIndex !== defaultIndex;
    }
    if (control.type === "checkbox" || control.type === "radio") { return control.checked !== control.defaultChecked; }
    return control.value !== control.defaultValue;
  }
  function choosing(region) {
    var active = document.activeElement;
    if (active && active !== region && region.contains(active) && /^(SELECT|INPUT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    var controls = region.querySelectorAll("select, input, textarea");
    for (var i = 0; i < controls.length; i++) {
      if (changedControl(controls[i])) { return true; }
    }
    return false;
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (elt && elt.hasAttribute && elt.hasAttribute("data-pause-while-choosing") && choosing(elt)) {
      event.preventDefault();
    }
  });

  // "Copy" next to an id in the technical details: copies the text of the element its
  // data-copy names, and says so on the button.
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!button) { return; }
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) { return; }
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      button.textContent = "Copied";
    });
  });

  // A pending rejection's countdown. Display only: the server commits the rejection when the
  // window has passed, whatever this page does.
  setInterval(function () {
    var counters = document.querySelectorAll("[data-countdown]");
    for (var i = 0; i < counters.length; i++) {
      var left = Math.max(0, parseInt(counters[i].getAttribute("data-countdown"), 10) - 1);
      counters[i].setAttribute("data-countdown", String(left));
      counters[i].textContent = String(left);
    }
  }, 1000);
})();
