// MathJax for pymdownx.arithmatex (generic mode): typesets \(...\), $...$ and \[...\], $$...$$ in the
// spans arithmatex marks, again after each instant-navigation page change of mkdocs-material.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true,
        processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
};

document$.subscribe(() => {
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
