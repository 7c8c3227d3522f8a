(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var STAGES = {};
  var GROUP_LABEL = {};
  D.groups.forEach(function (g) {
    GROUP_LABEL[g.name] = g.label;
    g.stages.forEach(function (s) { STAGES[s.id] = s; });
  });
  var opts = { changesOnly: true, wrap: false };
  var current = null;
  var activeRegion = null;
  var CONTEXT = 3;
  var OWN_COLOR = "#b9bfcb";
  var MAX_CHIPS = 8;

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === "text") e.textContent = v;
        else if (k === "html") e.innerHTML = v;
        else if (k === "style") e.setAttribute("style", v);
        else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
        else e.setAttribute(k, v);
      });
    }
    (children || []).forEach(function (c) {
      if (c !== null && c !== undefined) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return e;
  }

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  function basename(p) { var i = p.lastIndexOf("/"); return i < 0 ? p : p.slice(i + 1); }

  // --- code formatting ---------------------------------------------------------------
  var CALL = /^([\s\S]*? = )?([A-Za-z_][\w.]*)(\([\s\S]*)$/;
  function codeHtml(code, color) {
    if (code.indexOf("return ") === 0) return '<span class="kw">return</span>' + esc(code.slice(6));
    var m = CALL.exec(code);
    if (!m) return esc(code);
    var fn = m[2];
    var style = color ? ' style="color:' + color + '"' : "";
    var cls = fn === "del" ? "kw" : "fn";
    return (m[1] ? esc(m[1]) : "") + '<span class="' + cls + '"' + style + ">" + esc(fn) + "</span>" + esc(m[3]);
  }

  function exColor(ex) { return ex ? D.executors[ex] : null; }

  // --- header: legend and memory summary ---------------------------------------------
  function buildLegend() {
    var legend = document.getElementById("legend");
    Object.keys(D.executors).forEach(function (name) {
      legend.appendChild(el("span", { "class": "chip", title: "symbols claimed by the " + name + " executor" }, [
        el("span", { "class": "dot", style: "background:" + D.executors[name] }), name]));
    });
    var own = D.groups.some(function (g) { return g.stages.some(function (s) { return s.rows.some(function (r) { return r.own; }); }); });
    if (own) {
      legend.appendChild(el("span", { "class": "chip", title: "symbols that run their own implementation (autodiff rules, alias barriers)" }, [
        el("span", { "class": "dot", style: "background:" + OWN_COLOR }), "own implementation"]));
    }
    var nreg = Object.keys(D.regions).length;
    legend.appendChild(el("span", { "class": "chip", title: "regions compiled as one symbol by fusion executors" },
      [nreg + " fusion region" + (nreg === 1 ? "" : "s")]));
  }

  function buildMemSummary() {
    var box = document.getElementById("memsummary");
    var colors = { forward: "#3b7dd8", backward: "#e07b39" };
    ["forward", "backward"].forEach(function (g) {
      var m = D.memory[g];
      if (!m) return;
      var live = m.live_at_peak.map(function (x) { return x[0] + " " + x[1]; }).join(", ");
      var link = el("a", { href: "#", title: "alive at the peak: " + live, onclick: function (ev) {
        ev.preventDefault(); if (m.peak_row !== null) goToRow(m.stage, m.peak_row);
      } }, ["symbol " + m.peak_row]);
      box.appendChild(el("span", { style: "margin-right:18px" }, [
        el("span", { "class": "dot", style: "background:" + colors[g] + ";margin-right:5px" }),
        g + " peak ", el("b", { text: m.peak_text }), " at ", link,
        " · alive after the return " + m.end_text + " · inputs " + m.inputs_text]));
      (m.grad_deaths || []).forEach(function (d) {
        box.appendChild(el("div", {}, [
          "gradient of " + d[0] + " (" + d[1] + ") freed at ",
          el("a", { href: "#", onclick: function (ev) { ev.preventDefault(); goToRow(m.stage, d[2]); } },
             ["symbol " + d[2]])]));
      });
    });
    document.querySelectorAll(".memchart .hit").forEach(function (r) {
      r.addEventListener("click", function () { goToRow(r.getAttribute("data-stage"), +r.getAttribute("data-row")); });
    });
  }

  // --- navigation ----------------------------------------------------------------------
  function diffCounts(s) {
    var add = 0, del = 0;
    s.diff.forEach(function (op) {
      if (op[0] === "insert" || op[0] === "replace") add += op[4] - op[3];
      if (op[0] === "delete" || op[0] === "replace") del += op[2] - op[1];
    });
    return [add, del];
  }

  function buildNav() {
    var nav = document.getElementById("stages");
    D.groups.forEach(function (g) {
      nav.appendChild(el("h3", { text: g.label + " · " + g.stages.length + " stage" + (g.stages.length === 1 ? "" : "s") }));
      g.stages.forEach(function (s) {
        var c = diffCounts(s);
        var info = [el("span", { text: s.rows.length + " symbols" + (s.ms !== null ? " · " + s.ms.toFixed(2) + " ms" : "") })];
        if (s.index > 0) {
          info.push(" · ", el("span", { "class": "plus", text: "+" + c[0] }), " ", el("span", { "class": "minus", text: "−" + c[1] }));
        }
        nav.appendChild(el("button", { "data-stage": s.id, title: s.stage, onclick: function () { select(s.id); } }, [
          el("span", { "class": "sname", text: (s.index + 1) + ". " + s.stage }),
          el("span", { "class": "sinfo" }, info)]));
      });
    });
  }

  // --- one stage, side by side with the one before --------------------------------------
  function sourceKey(i) {
    if (i < 0) return "";
    var s = D.sources[i];
    return s.user ? s.user[0] + ":" + s.user[1] : s.file + ":" + s.line;
  }

  function sourceRow(i, ncols) {
    // the user's line; library lines that led from it ("via") are added as rows join the group
    var s = D.sources[i];
    var main = s.library && s.user ? s.user : [s.file, s.line, s.text];
    var via = el("span", { "class": "via" });
    var kids = [el("a", { "class": "loc", href: "file://" + main[0], title: main[0] + ":" + main[1] }, [basename(main[0]) + ":" + main[1]]),
                main[2] || "", via];
    var stack = s.stack.map(function (f) { return f[0] + ":" + f[1] + "  " + f[2]; }).join("\n");
    var tr = el("tr", { "class": "src", "data-user": sourceKey(i), title: "click: mark every symbol from this line\n\n" + stack,
                        onclick: function (ev) { if (ev.target.tagName !== "A") markSource(sourceKey(i)); } },
                [el("td", { colspan: ncols }, kids)]);
    return { tr: tr, key: sourceKey(i), seen: {}, via: via };
  }

  function addVia(header, i) {
    var s = D.sources[i];
    if (!s.library || !s.user) return;
    var name = basename(s.file) + ":" + s.line;
    if (header.seen[name]) return;
    header.seen[name] = 1;
    var n = Object.keys(header.seen).length;
    if (n <= 3) header.via.textContent = (n === 1 ? "via " : header.via.textContent + ", ") + name + (n === 1 ? "  " + s.text : "");
    else if (n === 4) header.via.textContent += ", …";
  }

  function sourceTitle(i) {
    if (i < 0) return "";
    var s = D.sources[i];
    var out = "\nfrom " + s.file + ":" + s.line + "  " + s.text;
    if (s.library && s.user) out += "\ncalled from " + s.user[0] + ":" + s.user[1] + "  " + s.user[2];
    return out;
  }

  function codeCell(row, side, idx, cls) {
    if (!row) return el("td", { "class": "c none " + side });
    var attrs = { "class": "c " + side + (cls ? " " + cls : "") + (row.kind === "fusion" ? " fusion" : ""),
                  "data-i": idx, "data-user": sourceKey(row.src),
                  title: row.code + (row.meta ? "\n" + row.meta : "") + (row.ex ? "\nexecutor: " + row.ex : "") + sourceTitle(row.src) };
    if (row.region) { attrs["data-region"] = row.region; attrs.style = "--rc:" + D.regions[row.region]; }
    var td = el("td", attrs);
    var tog = null;
    var subs = subLines(row);
    if (subs) tog = el("span", { "class": "tog", title: "show what it decomposes into", text: "▸" });
    else td.appendChild(el("span", { "class": "tog" }));
    if (tog) td.appendChild(tog);
    var color = exColor(row.ex);
    var badge = row.ex ? ["executor: " + row.ex, "background:" + color]
      : row.own ? ["runs its own implementation (" + row.own + ")", "background:" + OWN_COLOR]
      : ["not claimed by an executor at this stage", "border:1px dashed #c3c8d2;width:8px"];
    td.appendChild(el("span", { "class": "ex", title: badge[0], style: badge[1] }));
    td.appendChild(el("span", { html: codeHtml(row.code, color) }));
    if (row.meta) td.appendChild(el("span", { "class": "meta", text: "  # " + row.meta }));
    if (tog) {
      tog.addEventListener("click", function (ev) { ev.stopPropagation(); toggleSubs(td, row); });
    }
    if (row.kind === "fusion") {
      td.querySelector(".fn").addEventListener("click", function () { highlightRegion(row.region); });
    }
    return td;
  }

  function subLines(row) {
    if (row.kind === "fusion") return row.members.length ? row.members : null;
    return row.decomp >= 0 ? D.decomps[row.decomp] : null;
  }

  function toggleSubs(td, row) {
    var tr = td.parentNode;
    var side = td.classList.contains("L") ? "L" : "R";
    var open = td.getAttribute("data-open") === "1";
    var next = tr.nextSibling;
    while (next && next.classList.contains("sub") && next.getAttribute("data-parent") === td.getAttribute("data-key")) {
      var n = next.nextSibling; next.remove(); next = n;
    }
    td.setAttribute("data-open", open ? "0" : "1");
    td.querySelector(".tog").textContent = open ? "▸" : "▾";
    if (open) return;
    if (!td.getAttribute("data-key")) td.setAttribute("data-key", "k" + Math.random().toString(36).slice(2));
    var key = td.getAttribute("data-key");
    var ncols = tr.children.length;
    var after = tr;
    var lines = row.kind === "fusion"
      ? row.members.map(function (m) { return { depth: 0, row: m }; })
      : D.decomps[row.decomp].map(function (l) { return { depth: l[0], row: { code: l[1], meta: l[2], kind: "sub", ex: null, region: null, src: -1, decomp: -1 } }; });
    lines.forEach(function (l) {
      var cells = [];
      var c = el("td", { "class": "c " + side });
      if (l.row.region) { c.setAttribute("data-region", l.row.region); c.setAttribute("style", "--rc:" + D.regions[l.row.region]); }
      if (activeRegion && l.row.region === activeRegion) c.classList.add("hl");
      c.appendChild(el("span", { "class": "tog" }));
      c.appendChild(el("span", { html: "  ".repeat(l.depth + 1) + codeHtml(l.row.code, null) }));
      if (l.row.meta) c.appendChild(el("span", { "class": "meta", text: "  # " + l.row.meta }));
      c.title = l.row.code + (l.row.meta ? "\n" + l.row.meta : "");
      if (ncols === 4) {
        var blank = el("td", { "class": "c " + (side === "L" ? "R" : "L") });
        cells = side === "L" ? [el("td", { "class": "ln" }), c, el("td", { "class": "ln" }), blank]
                             : [el("td", { "class": "ln" }), blank, el("td", { "class": "ln" }), c];
      } else {
        cells = [el("td", { "class": "ln" }), c];
      }
      var sub = el("tr", { "class": "sub", "data-parent": key }, cells);
      after.parentNode.insertBefore(sub, after.nextSibling);
      after = sub;
    });
  }

  function pairs(s, prev) {
    // [leftIndex|null, rightIndex|null, class] for every line of the side-by-side diff
    var out = [];
    s.diff.forEach(function (op) {
      var tag = op[0], i1 = op[1], i2 = op[2], j1 = op[3], j2 = op[4];
      if (tag === "equal") {
        for (var k = 0; k < i2 - i1; k++) out.push([i1 + k, j1 + k, "eq"]);
      } else {
        var n = Math.max(i2 - i1, j2 - j1);
        for (var m = 0; m < n; m++) {
          out.push([i1 + m < i2 ? i1 + m : null, j1 + m < j2 ? j1 + m : null, prev ? tag : "first"]);
        }
      }
    });
    return out;
  }

  function render(id) {
    var s = STAGES[id];
    var group = D.groups.filter(function (g) { return g.name === s.group; })[0];
    var prev = s.index > 0 ? STAGES[s.group + "-" + (s.index - 1)] : null;
    var view = document.getElementById("view");
    view.innerHTML = "";
    view.setAttribute("data-stage", id);
    var controls = el("div", { "class": "controls" }, [
      el("label", {}, [el("input", { type: "checkbox", id: "opt-changes", checked: opts.changesOnly ? "checked" : null,
        onchange: function (e) { opts.changesOnly = e.target.checked; render(id); } }), " changes only"]),
      el("label", {}, [el("input", { type: "checkbox", id: "opt-wrap", checked: opts.wrap ? "checked" : null,
        onchange: function (e) { opts.wrap = e.target.checked; render(id); } }), " wrap lines"])]);
    var sub = "stage " + (s.index + 1) + " of " + group.stages.length + " · " + s.rows.length + " symbols" +
              (s.ms !== null ? " · " + s.ms.toFixed(2) + " ms" : "");
    var regionBox = el("div", { "class": "regions" });
    s.regions.forEach(function (rid, k) {
      var n = s.rows.filter(function (r) { return r.region === rid && r.kind !== "fusion"; }).length;
      var f = s.rows.filter(function (r) { return r.region === rid && r.kind === "fusion"; })[0];
      var count = f ? f.members.length : n;
      regionBox.appendChild(el("span", { "class": "region-chip", "data-region": rid, style: "--rc:" + D.regions[rid],
        title: "click: highlight the symbols of this region", onclick: function () { highlightRegion(rid); } },
        [rid + " · " + count + " symbols"]));
      if (k >= MAX_CHIPS) regionBox.lastChild.classList.add("extra");
    });
    if (s.regions.length > MAX_CHIPS) {
      regionBox.appendChild(el("span", { "class": "region-more", text: "+" + (s.regions.length - MAX_CHIPS) + " more",
        onclick: function (e) { regionBox.classList.add("all"); e.target.remove(); } }));
    }
    view.appendChild(el("div", { "class": "stagehead" }, [
      el("h2", { text: group.label + ": " + s.stage }), el("span", { "class": "sub", text: sub }), controls, regionBox]));
    if (s.note) view.appendChild(el("div", { "class": "args piece", text: s.note }));
    view.appendChild(el("div", { "class": "args", title: s.args.join("\n"), text: "def " + s.name + "(" + s.args.join(", ") + ")" }));
    var two = !!prev;
    var ncols = two ? 4 : 2;
    var table = el("table", { "class": "diff" + (opts.wrap ? " wrap" : "") });
    var cg = el("colgroup", {}, two ? [el("col", { "class": "ln" }), el("col"), el("col", { "class": "ln" }), el("col")]
                                   : [el("col", { "class": "ln" }), el("col")]);
    table.appendChild(cg);
    table.appendChild(el("thead", {}, [el("tr", {}, two
      ? [el("th", { colspan: 2, text: "before: " + prev.stage }), el("th", { colspan: 2, text: "this stage: " + s.stage })]
      : [el("th", { colspan: 2, text: "this stage: " + s.stage + " (the first: nothing to compare with)" })])]));
    var body = el("tbody");
    table.appendChild(body);
    view.appendChild(table);

    var lines = pairs(s, prev);
    var lastSrc = null;
    function emit(p) {
      var lr = p[0] !== null ? prev.rows[p[0]] : null;
      var rr = p[1] !== null ? s.rows[p[1]] : null;
      var srow = rr || lr;
      if (srow.src >= 0) {
        if (!lastSrc || lastSrc.key !== sourceKey(srow.src)) {
          lastSrc = sourceRow(srow.src, ncols);
          body.appendChild(lastSrc.tr);
        }
        addVia(lastSrc, srow.src);
      }
      var cls = { eq: "", replace: "chg", insert: "add", "delete": "del", first: "" }[p[2]];
      var lcls = p[2] === "replace" ? "del" : cls;
      var rcls = p[2] === "replace" ? "add" : cls;
      var cells = two
        ? [el("td", { "class": "ln", text: p[0] !== null ? p[0] + 1 : "" }), codeCell(lr, "L", p[0], lcls),
           el("td", { "class": "ln", text: p[1] !== null ? p[1] + 1 : "" }), codeCell(rr, "R", p[1], rcls)]
        : [el("td", { "class": "ln", text: p[1] + 1 }), codeCell(rr, "R", p[1], "")];
      body.appendChild(el("tr", { "class": "r" }, cells));
    }
    function fold(hidden) {
      var regions = {};
      hidden.forEach(function (p) {
        var r = (p[1] !== null ? s.rows[p[1]] : prev.rows[p[0]]).region;
        if (r) regions[r] = 1;
      });
      var tr = el("tr", { "class": "fold", "data-regions": Object.keys(regions).join(" "),
                          "data-rows": hidden.map(function (p) { return p[1]; }).join(" ") },
                  [el("td", { colspan: ncols, text: "⋯ " + hidden.length + " unchanged symbols (click to show)" })]);
      tr.addEventListener("click", function () { unfold(tr, hidden); });
      body.appendChild(tr);
    }
    function unfold(tr, hidden) {
      var marker = tr.nextSibling;
      var tmp = body;
      var frag = document.createDocumentFragment();
      body = frag;
      lastSrc = null;
      hidden.forEach(emit);
      body = tmp;
      body.insertBefore(frag, marker);
      tr.remove();
      if (activeRegion) applyRegion();
    }
    var k = 0;
    while (k < lines.length) {
      if (!two || !opts.changesOnly || lines[k][2] !== "eq") { emit(lines[k]); k++; continue; }
      var e = k;
      while (e < lines.length && lines[e][2] === "eq") e++;
      var run = lines.slice(k, e);
      var head = k === 0 ? 0 : CONTEXT, tail = e === lines.length ? 0 : CONTEXT;
      if (run.length > head + tail + 2) {
        run.slice(0, head).forEach(emit);
        fold(run.slice(head, run.length - tail));
        lastSrc = null;
        run.slice(run.length - tail).forEach(emit);
      } else {
        run.forEach(emit);
      }
      k = e;
    }
    if (activeRegion) applyRegion();
  }

  // --- interactions ------------------------------------------------------------------------
  function select(id, keepRegion) {
    if (!STAGES[id]) return;
    current = id;
    if (!keepRegion) activeRegion = null;
    document.querySelectorAll("nav button").forEach(function (b) {
      b.classList.toggle("active", b.getAttribute("data-stage") === id);
    });
    render(id);
    try { history.replaceState(null, "", "#" + id); } catch (e) { /* some browsers refuse it on file:// pages */ }
  }

  function applyRegion() {
    var view = document.getElementById("view");
    if (activeRegion) {
      view.querySelectorAll("tr.fold").forEach(function (f) {
        if ((" " + f.getAttribute("data-regions") + " ").indexOf(" " + activeRegion + " ") >= 0) f.click();
      });
      view.querySelectorAll("td.c.fusion[data-region]").forEach(function (td) {
        if (td.getAttribute("data-region") === activeRegion && td.getAttribute("data-open") !== "1") {
          var s = STAGES[current];
          var side = td.classList.contains("L") ? STAGES[s.group + "-" + (s.index - 1)] : s;
          toggleSubs(td, side.rows[+td.getAttribute("data-i")]);
        }
      });
    }
    if (activeRegion) {
      var chip = view.querySelector('.region-chip.extra[data-region="' + activeRegion + '"]');
      if (chip) chip.parentNode.classList.add("all");
    }
    view.querySelectorAll("[data-region]").forEach(function (n) {
      n.classList.toggle("hl", n.getAttribute("data-region") === activeRegion);
    });
  }

  function highlightRegion(rid) {
    activeRegion = activeRegion === rid ? null : rid;
    applyRegion();
    if (!activeRegion) return;
    var first = document.querySelector("#view td.c.R.hl") || document.querySelector("#view td.c.hl");
    if (first) first.scrollIntoView({ block: "center" });
  }

  function markSource(key) {
    var cells = document.querySelectorAll("#view td.c");
    var on = false;
    cells.forEach(function (td) { if (td.getAttribute("data-user") === key && !td.classList.contains("srchl")) on = true; });
    cells.forEach(function (td) { td.classList.toggle("srchl", on && td.getAttribute("data-user") === key); });
  }

  function goToRow(stageId, rowIndex) {
    if (current !== stageId) select(stageId);
    var view = document.getElementById("view");
    view.querySelectorAll("tr.fold").forEach(function (f) {
      if ((" " + f.getAttribute("data-rows") + " ").indexOf(" " + rowIndex + " ") >= 0) f.click();
    });
    var td = view.querySelector('td.c.R[data-i="' + rowIndex + '"]');
    if (!td) return;
    var tr = td.parentNode;
    tr.classList.remove("flash");
    void tr.offsetWidth;
    tr.classList.add("flash");
    tr.scrollIntoView({ block: "center" });
  }

  buildLegend();
  buildMemSummary();
  buildNav();
  var want = decodeURIComponent((location.hash || "").slice(1));
  var firstGroup = D.groups[0];
  select(STAGES[want] ? want : firstGroup.name + "-" + (firstGroup.stages.length - 1));
})();
