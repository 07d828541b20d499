// Draws the user's entity graph (nodes: entities, size by mentions; edges: mentioned together).
(function () {
  const box = document.getElementById("graph");
  if (!box) return;
  fetch(box.dataset.src, { credentials: "same-origin" })
    .then((r) => r.json())
    .then((g) => {
      const most = Math.max(1, ...g.nodes.map((n) => n.count));
      const elements = g.nodes.map((n) => ({ data: { id: n.id, label: n.label, size: 18 + 42 * Math.sqrt(n.count / most) } }))
        .concat(g.edges.map((e, i) => ({ data: { id: "e" + i, source: e.source, target: e.target, weight: e.weight } })));
      window.memoryGraph = cytoscape({
        container: box,
        elements: elements,
        layout: { name: "cose", animate: false, randomize: false, nodeRepulsion: 9000 },
        style: [
          { selector: "node", style: { label: "data(label)", width: "data(size)", height: "data(size)",
            "background-color": "#5b7fe0", color: "#1d2330", "font-size": 11, "text-valign": "bottom", "text-margin-y": 3 } },
          { selector: "edge", style: { width: "mapData(weight, 1, 10, 1, 6)", "line-color": "#c5cbd6", "curve-style": "haystack" } },
        ],
      });
      box.dataset.ready = String(g.nodes.length);
    });
})();
