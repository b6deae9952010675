#!/usr/bin/env python
"""Offline docs: `nbdev-proc-nbs`, then each processed notebook to HTML in `_docs/`, and README.md from index.ipynb.

`nbdev-docs` and `nbdev-readme` need Quarto, which cannot be installed everywhere (it downloads its binary at build
time). This renders the same processed notebooks (`_proc/`, with nbdev's directives applied: hidden cells dropped,
`show_doc` rendered) with nbconvert instead. Every page carries a sidebar with all pages in chapter order, a contents
list of its H2/H3 headings when it has several, and `nbs/styles.css`; plots and the local images markdown cells link
are embedded as data URIs, so a page is one file that shows the same wherever it is opened.

Math is typeset by MathJax 3. With a local copy (the npm package) its files are copied next to the pages, so they
work offline; without one the pages load it from a CDN, and an offline browser shows the TeX source:

    npm install --prefix ~/.cache/triton_fa2/mathjax mathjax@3   # once; found there by default
    python tools/render_docs.py                                # _docs/*.html, MathJax in _docs/mathjax/
    python tools/render_docs.py --out /tmp/docs --mathjax DIR    # DIR: the npm prefix, the package or its es5/
    python tools/render_docs.py --readme                       # also README.md from nbs/index.ipynb
"""
import argparse, base64, html, mimetypes, os, re, shutil, sys
from pathlib import Path

import nbformat, yaml
from nbconvert import HTMLExporter, MarkdownExporter
from nbconvert.preprocessors import TagRemovePreprocessor
import nbdev.doclinks
from nbdev.config import get_config
from nbdev.quarto import nbdev_sidebar, refresh_quarto_yml
from nbdev.serve import proc_nbs

ROOT = Path(__file__).resolve().parents[1]
README_HEADER = "<!-- Generated from nbs/index.ipynb by tools/render_docs.py --readme; edit the notebook, not this file. -->\n\n"
MATHJAX_ENV = "TRITON_FA2_MATHJAX"                              # where a local MathJax is, if not in the default place
MATHJAX_DEFAULT = Path("~/.cache/triton_fa2/mathjax").expanduser()  # `npm install --prefix` this folder
MATHJAX_CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"
MATHJAX_ENTRY = "tex-svg.js"   # SVG output: the glyphs are inside the script, so no web fonts have to load from file://
MATHJAX_PARTS = (MATHJAX_ENTRY, "input/tex/extensions", "ui", "a11y")  # the entry and what it loads on demand
TOC_MIN_HEADINGS = 3           # a page with fewer H2/H3 headings gets no contents list


def front_matter(nb):
    "Title and description from the raw YAML cell nbdev puts first, which is then dropped."
    meta = {}
    if nb.cells and nb.cells[0].cell_type == "raw" and nb.cells[0].source.startswith("---"):
        meta = yaml.safe_load(nb.cells.pop(0).source.strip("-\n")) or {}
    return meta.get("title", ""), meta.get("description", "")


def page_name(nb_name):
    "The page Quarto writes for a notebook, as nbdev names it: `00_naive.ipynb` -> `naive.html`."
    return re.sub(r"^\d+_", "", Path(nb_name).stem) + ".html"


def read(p):
    "A processed notebook, without the per-cell timings nbdev records (nbformat rejects them as numbers)."
    nb = nbformat.read(p, as_version=4)
    for c in nb.cells:
        c.metadata.pop("execution", None)
        if c.cell_type != "code": continue
        lines = c.source.splitlines()
        directives = [l for l in lines if l.startswith("#|")]
        c.source = "\n".join(l for l in lines if not l.startswith("#|"))  # Quarto's cell options, not code
        if any(d.replace(" ", "") == "#|echo:false" for d in directives):
            c.metadata.setdefault("tags", []).append("remove_input")
        for o in c.get("outputs", []):
            md = o.get("data", {}).get("text/markdown")
            if md:  # show_doc's source link floats right on Quarto's site through Pandoc attributes, here through a class
                md = re.sub(r"\[source\]\(([^)\s]+)\)\{target=[^}]*\}", r'<a class="fa2-source" href="\1">source</a>', md)
                o["data"]["text/markdown"] = re.sub(r"\{target=[^}]*\}", "", md)  # other Pandoc link attributes
    return nb


def pages(proc):
    "Processed notebooks in reading order: index first, then by chapter number."
    return sorted(proc.glob("*.ipynb"), key=lambda p: (p.stem != "index", p.stem))


def link_pages(text, base=""):
    "Point relative links at sibling notebooks (`00_naive.ipynb`) to their rendered pages (`naive.html`)."
    return re.sub(r'(\(|href=")(\w+\.ipynb)', lambda m: f"{m[1]}{base}{page_name(m[2])}", text)


# --- MathJax -------------------------------------------------------------------------------------------------------

def find_mathjax(arg=None):
    """The `es5/` folder of a local MathJax 3, or None for the CDN.

    `arg` (the `--mathjax` option) is a folder or `cdn`; without it, `$TRITON_FA2_MATHJAX`, then `MATHJAX_DEFAULT`.
    A folder may be an npm prefix (`node_modules/mathjax/es5` inside), the package, or its `es5/` itself. A folder
    named explicitly that holds no MathJax is an error; the default place may simply be empty."""
    if arg == "cdn": return None
    named = arg or os.environ.get(MATHJAX_ENV)
    for d in [Path(named).expanduser()] if named else [MATHJAX_DEFAULT]:
        for es5 in (d / "node_modules" / "mathjax" / "es5", d / "es5", d):
            if (es5 / MATHJAX_ENTRY).is_file(): return es5
    if named: raise SystemExit(f"no MathJax 3 in {named} (looked for {MATHJAX_ENTRY} in node_modules/mathjax/es5/, es5/ "
                               f"and the folder itself); install it with `npm install --prefix {named} mathjax@3`")
    return None


def copy_mathjax(es5, out):
    "Copy the parts of MathJax the pages load into `out/mathjax/`; returns the script's path relative to the pages."
    dest = out / "mathjax"
    shutil.rmtree(dest, ignore_errors=True)
    for part in MATHJAX_PARTS:
        src = es5 / part
        if src.is_dir(): shutil.copytree(src, dest / part)
        elif src.is_file(): (dest / part).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(src, dest / part)
    return f"mathjax/{MATHJAX_ENTRY}"


def mathjax_head(src):
    """MathJax 3's configuration and script: `$…$`/`\\(…\\)` inline, `$$…$$`/`\\[…\\]` displayed, code left alone;
    `textmacros` so that `\\text{block\\_m}` reads as in LaTeX."""
    note = "local copy" if not src.startswith("http") else "CDN: offline, math shows as TeX source (see tools/render_docs.py)"
    return (f"<!-- MathJax 3, {note} -->\n<script>window.MathJax = {{tex: {{inlineMath: [['$', '$'], ['\\\\(', '\\\\)']], "
            "displayMath: [['$$', '$$'], ['\\\\[', '\\\\]']], processEscapes: true, tags: 'ams', "
            "packages: {'[+]': ['textmacros']}}, loader: {load: ['[tex]/textmacros']}, "
            "svg: {fontCache: 'global'}, options: {menuOptions: {settings: {assistiveMml: false}}}};</script>\n"
            f'<script id="MathJax-script" defer src="{src}"></script>\n')


# --- page furniture: sidebar, contents, images, links --------------------------------------------------------------

def _inline(text):
    "Title text as HTML: escaped, `code` spans as <code>."
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def sidebar(entries, current):
    "Every page in chapter order, the current one marked; a chapter shows its number and the title up to its colon."
    items = []
    for p, title in entries:
        num = p.stem.split("_")[0] if p.stem[:2].isdigit() else ""
        short = title.split(": ")[0] if num else "Home"
        here = ' class="fa2-current" aria-current="page"' if p.stem == current else ""
        items.append(f'<li><a href="{page_name(p.name)}"{here} title="{html.escape(re.sub("`", "", title))}">'
                     f'<span class="fa2-num">{num}</span><span class="fa2-title">{_inline(short)}</span></a></li>')
    return (f'<nav class="fa2-sidebar" aria-label="Pages"><a class="fa2-site" href="index.html">{html.escape(get_config().title)}</a>'
            f'<ol>{"".join(items)}</ol></nav>')


_HEADING = re.compile(r'<h([23]) id="([^"]+)">(.*?)</h\1>', re.S)


def api_names(nb):
    "The names `show_doc` outputs document in `nb` (their `### name` headings), set in code in the contents list."
    return {m for c in nb.cells if c.cell_type == "code" and "show_doc" in c.source for o in c.get("outputs", [])
            for m in re.findall(r"^#{2,4} (\S+)\s*$", o.get("data", {}).get("text/markdown", ""), re.M)}


def contents(body, api=()):
    "The page's H2 and H3 headings as a nested list, or '' when there are fewer than `TOC_MIN_HEADINGS`."
    heads = []
    for level, hid, inner in _HEADING.findall(body):
        text = re.sub(r"<[^>]+>", "", re.sub(r'<a class="anchor-link".*?</a>', "", inner)).strip()
        if text: heads.append((int(level), hid, text))
    if len(heads) < TOC_MIN_HEADINGS: return ""
    items = []
    for level, hid, text in heads:
        label = f"<code>{text}</code>" if html.unescape(text) in api else text  # show_doc's entries
        items.append(f'<li class="fa2-toc-h{level}"><a href="#{hid}">{label}</a></li>')
    return f'<nav class="fa2-toc" aria-label="On this page"><p class="fa2-toc-title">On this page</p><ul>{"".join(items)}</ul></nav>'


def embed_images(body, base):
    "Local images (`<img src=\"../results/hero.png\">`, relative to the notebook's folder `base`) as data URIs."
    missing = []
    def data_uri(m):
        src = html.unescape(m[2])
        if re.match(r"(data:|[a-z]+://|//)", src): return m[0]
        path = (base / src.split("#")[0].split("?")[0]).resolve()
        if not path.is_file(): missing.append(src); return m[0]
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return f'{m[1]}data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}{m[3]}'
    body = re.sub(r'(<img\b[^>]*?\bsrc=")([^"]*)(")', data_uri, body)
    return body, missing


def local_doc_links(body, names):
    "Links nbdev made to the published site's pages (`https://host/base/naive.html#x`) go to the rendered sibling page."
    cfg = get_config()
    site = re.escape(f"{cfg.doc_host}{cfg.doc_baseurl}".rstrip("/") + "/")
    return re.sub(rf'href="{site}([\w-]+\.html)', lambda m: f'href="{m[1]}' if m[1] in names else m[0], body)


def styles():
    "nbs/styles.css, the site's stylesheet (it also holds the offline layout), inlined into each page."
    css = ROOT / "nbs" / "styles.css"
    return f"<style>\n{css.read_text()}\n</style>\n" if css.exists() else ""


def render_html(proc, out, mathjax=None, nbs=None):
    """Every processed notebook in `proc` as a page in `out`; `mathjax` is a local MathJax's es5/ folder or None (CDN).
    `nbs`, the notebooks' folder, is where relative image links are resolved (default: nbdev's nbs_path)."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.html"): stale.unlink()
    nbs = Path(nbs or get_config().nbs_path)
    exporter = HTMLExporter(template_name="lab", exclude_input_prompt=True, exclude_output_prompt=True)
    exporter.register_preprocessor(TagRemovePreprocessor(remove_input_tags={"remove_input"}), enabled=True)
    exporter.register_filter("clean_html", lambda html: html)   # our own notebooks, no one else's HTML: bleach's sanitising took three quarters of the render time
    script = copy_mathjax(mathjax, out) if mathjax else MATHJAX_CDN
    entries = [(p, front_matter(read(p))[0] or p.stem) for p in pages(proc)]
    names = {page_name(p.name) for p, _ in entries}
    css, problems = styles(), []
    for p, title in entries:
        nb = read(p)
        _, desc = front_matter(nb)
        nb.cells = [c for c in nb.cells if not (c.cell_type == "markdown" and c.source.strip().startswith("<!-- WARNING: THIS FILE"))]
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {title}\n\n> {desc}" if desc else f"# {title}"))
        body, _ = exporter.from_notebook_node(nb)
        body = re.sub(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->\n?", "", body, flags=re.S)
        body = body.replace("</head>", mathjax_head(script) + css + "</head>", 1)
        page_title = re.sub(r"`", "", title) if p.stem == "index" else f"{re.sub('`', '', title)} – {get_config().title}"
        body = re.sub(r"<title>.*?</title>", lambda m: f"<title>{html.escape(page_title)}</title>", body, count=1, flags=re.S)
        body, missing = embed_images(body, nbs)
        problems += [f"{p.name}: image {m} not found" for m in missing]
        toc = contents(body, api_names(nb))
        body = re.sub(r"(<body[^>]*>)\s*<main>", lambda m: f'{m[1]}<div class="fa2-layout{" fa2-has-toc" if toc else ""}">'
                      f"{sidebar(entries, p.stem)}{toc}<main class=\"fa2-main\">", body, count=1)
        body = re.sub(r"</main>\s*</body>", "</main></div>\n</body>", body, count=1)
        (out / page_name(p.name)).write_text(local_doc_links(link_pages(body), names))
    for line in problems: print("warning:", line, file=sys.stderr)
    return out


def render_readme(proc, dest):
    cfg = get_config()
    nb = read(proc / "index.ipynb")
    nb.metadata["language_info"] = {"name": "python"}  # fenced code blocks as ```python
    title, desc = front_matter(nb)
    exporter = MarkdownExporter(exclude_input_prompt=True, exclude_output_prompt=True)
    exporter.register_preprocessor(TagRemovePreprocessor(remove_input_tags={"remove_input"}), enabled=True)  # `#| echo: false`
    body, _ = exporter.from_notebook_node(nb)
    body = link_pages(body, base=f"{cfg.doc_host}{cfg.doc_baseurl}/").replace("<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->\n", "")
    body = body.replace("](../results/", "](results/")  # the notebook sits in nbs/, the README at the top
    text = README_HEADER + f"# {title}\n\n> {desc}\n\n" + re.sub(r"\n{3,}", "\n\n", body.strip()) + "\n"
    dest.write_text(text)
    return dest


def proc_nbs_offline():
    "What `nbdev-proc-nbs` does, less its attempt to download and install Quarto."
    os.chdir(ROOT)
    refresh_quarto_yml()
    nbdev.doclinks._build_modidx()
    nbdev_sidebar.__wrapped__(path=get_config().nbs_path)
    return proc_nbs(get_config().nbs_path)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(l for l in __doc__.splitlines() if l.startswith("    ")))
    ap.add_argument("--readme", action="store_true", help="also write README.md from nbs/index.ipynb")
    ap.add_argument("--out", default=str(ROOT / "_docs"), help="folder for the HTML pages (default: _docs/)")
    ap.add_argument("--mathjax", metavar="DIR", help=f"a local MathJax 3 (npm prefix, package or es5/ folder), copied "
                    f"into OUT/mathjax/; 'cdn' to load it from the CDN. Default: ${MATHJAX_ENV}, else {MATHJAX_DEFAULT} "
                    "if MathJax is there, else the CDN")
    args = ap.parse_args()
    mathjax, out = find_mathjax(args.mathjax), Path(args.out).resolve()   # before proc_nbs_offline changes folder
    mathjax = mathjax and mathjax.resolve()
    proc_nbs_offline()
    out = render_html(ROOT / "_proc", out, mathjax=mathjax)
    print(f"{len(list(out.glob('*.html')))} pages in {out}")
    if mathjax: print(f"MathJax: {mathjax} copied into {out / 'mathjax'}")
    else: print(f"MathJax: none found{'' if args.mathjax == 'cdn' else ' locally'}; the pages load it from {MATHJAX_CDN}, so "
                f"offline the math shows as TeX source. For offline math: npm install --prefix {MATHJAX_DEFAULT} mathjax@3")
    if args.readme: print("wrote", render_readme(ROOT / "_proc", ROOT / "README.md"))
