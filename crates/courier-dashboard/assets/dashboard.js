// Courier dashboard: the only script. It asks before a form marked `data-confirm` is posted
// (without JavaScript the server shows a confirmation page instead), and keeps errors seen on
// the page in `window.__courierErrors` for the browser tests.
(function () {
  "use strict";
  window.__courierErrors = window.__courierErrors || [];
  window.addEventListener("error", function (e) {
    window.__courierErrors.push(String(e.message || e));
  });
  window.addEventListener("unhandledrejection", function (e) {
    window.__courierErrors.push("unhandled rejection: " + String(e.reason));
  });
  var original = console.error;
  console.error = function () {
    window.__courierErrors.push(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var question = form.getAttribute("data-confirm");
    if (!question) {
      return;
    }
    if (!window.confirm(question)) {
      e.preventDefault();
      return;
    }
    var confirmed = form.querySelector("input[name=confirmed]");
    if (confirmed) {
      confirmed.value = "1";
    }
  });
})();
