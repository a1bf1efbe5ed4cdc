"""The graph page's template, style and drawing script (`figures.graph`): plain SVG, no library, no network.

The script reads the JSON in <script id="graph-data"> (nodes with their boxes computed in Python, edges,
slider steps), draws every node as a box with its label set through textContent, every edge as a curve from
the top of its source to the bottom of its target, and wires the slider and the click panel.
"""

CSS = """
body{font-family:system-ui,sans-serif;margin:.5em;color:#222}
h1{font-size:1.3em;margin:.2em 0} p.sub{color:#555;margin:.2em 0;overflow-wrap:anywhere}
.scores span{display:inline-block;margin-right:1.5em;font-family:monospace}
.controls{margin:.5em 0} .controls label{margin-right:1em}
#graph{display:block;border:1px solid #eee}
#panel{font-size:13px;max-width:1360px;overflow-wrap:anywhere}
#panel table{border-collapse:collapse} #panel td{padding:1px 6px;border-bottom:1px solid #eee}
g.node{cursor:pointer} g.node text{font-family:monospace;font-size:11px;pointer-events:none}
g.node.selected rect{stroke:#000;stroke-width:2} path.edge.hot{stroke-opacity:1}
text.row{font-size:11px;fill:#555} .legend span{font-family:monospace;margin-right:1em}
"""

TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{{ title }}</title><style>{{ css|safe }}</style></head>
<body>
<h1>{{ title }}</h1>
{% if subtitle %}<p class="sub">{{ subtitle }}</p>{% endif %}
<p class="scores">{% for name, value in scores %}<span>{{ name }}: {{ value }}</span>{% endfor %}</p>
<p class="legend"><span style="color:{{ positive }}">&#9644; positive</span><span style="color:{{ negative }}">&#9644;
negative</span> width: |weight|. Click a node for its edges.</p>
<div class="controls"><label>edges with |weight| &ge; <strong id="threshold">0</strong>
<input id="prune" type="range" min="0" max="{{ n_steps - 1 }}" value="0" step="1"></label>
<span id="shown">{{ n_nodes }} nodes, {{ n_edges }} edges</span></div>
<div id="wrap"><svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{{ width }}" height="{{ height }}"
viewBox="0 0 {{ width }} {{ height }}"></svg><div id="panel"></div></div>
<script type="application/json" id="graph-data">{{ data }}</script>
<script>{{ script|safe }}</script>
</body></html>
"""

SCRIPT = r"""
(function () {
  const D = JSON.parse(document.getElementById('graph-data').textContent);
  const NS = 'http://www.w3.org/2000/svg';
  const svg = document.getElementById('graph'), panel = document.getElementById('panel');
  const slider = document.getElementById('prune');
  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    parent.appendChild(e);
    return e;
  }
  function html(tag, text, parent) {
    const e = document.createElement(tag);
    e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  D.rows.forEach(r => { el('text', {x: 4, y: r.y, class: 'row', 'dominant-baseline': 'central'}, svg).textContent = r.label; });
  const gEdges = el('g', {class: 'edges'}, svg), gNodes = el('g', {class: 'nodes'}, svg);
  const edgeEls = D.edges.map((e, i) => {
    let s = D.nodes[e.s], t = D.nodes[e.t];
    if (s.y < t.y) [s, t] = [t, s];  // draw from the lower box's top to the upper box's bottom
    const x1 = s.x + s.w / 2, y1 = s.y, x2 = t.x + t.w / 2, y2 = t.y + t.h, m = (y1 + y2) / 2;
    const p = el('path', {d: `M${x1},${y1} C${x1},${m} ${x2},${m} ${x2},${y2}`, class: 'edge', fill: 'none',
      stroke: e.w >= 0 ? D.positive : D.negative, 'stroke-width': e.sw, 'stroke-opacity': 0.55, 'data-index': i}, gEdges);
    el('title', {}, p).textContent = `${D.nodes[e.s].label} -> ${D.nodes[e.t].label}: ${e.w.toPrecision(3)} ${e.label}`;
    return p;
  });
  const nodeEls = D.nodes.map((n, i) => {
    const g = el('g', {class: 'node ' + n.kind, 'data-id': n.id, 'data-index': i}, gNodes);
    el('rect', {x: n.x, y: n.y, width: n.w, height: n.h, rx: 4, fill: D.colors[n.kind] || '#eee', stroke: '#888'}, g);
    const t = el('text', {x: n.x + n.w / 2, y: n.y + n.h / 2 + 0.5, 'text-anchor': 'middle', 'dominant-baseline': 'central',
      textLength: n.tw, lengthAdjust: 'spacingAndGlyphs'}, g);
    t.textContent = n.text;
    el('title', {}, g).textContent = n.label;
    g.addEventListener('click', () => show(i));
    return g;
  });
  function prune(k) {
    const thr = D.steps[k], on = new Set();
    let nEdges = 0, nNodes = 0;
    D.edges.forEach((e, i) => {
      const vis = e.a >= thr;
      edgeEls[i].style.display = vis ? '' : 'none';
      if (vis) { on.add(e.s); on.add(e.t); nEdges++; }
    });
    D.nodes.forEach((n, i) => {
      const vis = D.always.includes(n.kind) || on.has(i);
      nodeEls[i].style.display = vis ? '' : 'none';
      if (vis) nNodes++;
    });
    document.getElementById('threshold').textContent = thr.toPrecision(3);
    document.getElementById('shown').textContent = `${nNodes} nodes, ${nEdges} edges`;
  }
  function edgeTable(title, list, other) {
    html('h4', `${title} (${list.length})`, panel);
    const table = document.createElement('table');
    list.sort((a, b) => b.a - a.a).forEach(e => {
      const row = table.insertRow();
      row.insertCell().textContent = D.nodes[other(e)].label + (e.label ? ` (${e.label})` : '');
      const c = row.insertCell();
      c.textContent = e.w.toPrecision(3);
      c.style.color = e.w >= 0 ? D.positive : D.negative;
    });
    panel.appendChild(table);
  }
  function show(i) {
    const n = D.nodes[i];
    nodeEls.forEach((g, j) => g.classList.toggle('selected', j === i));
    edgeEls.forEach((p, j) => p.classList.toggle('hot', D.edges[j].s === i || D.edges[j].t === i));
    panel.replaceChildren();
    html('h3', n.label, panel);
    html('p', `${n.kind}, layer ${n.layer}, position ${n.pos}` +
      (n.activation !== undefined ? `, activation ${n.activation.toPrecision(3)}` : ''), panel);
    if (n.detail) html('p', n.detail, panel);
    if (n.members) html('p', 'members: ' + n.members.join(', '), panel);
    if (n.url) { const a = html('a', 'open its page', html('p', '', panel)); a.href = n.url; a.target = '_blank'; }
    edgeTable('incoming', D.edges.filter(e => e.t === i), e => e.s);
    edgeTable('outgoing', D.edges.filter(e => e.s === i), e => e.t);
  }
  slider.addEventListener('input', () => prune(+slider.value));
  prune(+slider.value);
  window.graphData = D;
  window.graphPrune = k => { slider.value = k; prune(k); };
  window.graphShow = show;
})();
"""
