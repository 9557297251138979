"""What a chart draws, read from Vega's own scenegraph as vl-convert renders it headless (no browser): every bar,
rule and text with its position on the canvas, so a test can check the picture a user sees (each bar over its own
label, no text over another or off the canvas) rather than only the spec's data.

Text widths are not in the scenegraph: a text's box is estimated from its font size (`CHAR_EM` of it per
character, a little wider than Vega's own measure of these fonts, so an estimate errs towards finding an overlap).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

CHAR_EM = 0.52
BOLD_CHAR_EM = 0.58


@dataclass(frozen=True)
class Item:
    """One drawn item, in canvas pixels (its group offsets added)."""

    marktype: str
    role: str
    name: str
    panel: str  # the view (concat cell, facet cell or layer) it is drawn in
    x: float
    y: float
    width: float = 0.0
    height: float = 0.0
    x2: float | None = None
    y2: float | None = None
    text: tuple[str, ...] = ()
    font_size: float = 11.0
    bold: bool = False
    align: str = "left"
    baseline: str = "alphabetic"
    angle: float = 0.0
    fill: str | None = None
    stroke: str | None = None
    datum: dict[str, str] = field(default_factory=dict)

    def box(self) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) of a text (estimated) or a rect."""
        if self.marktype != "text":
            return (self.x, self.y, self.x + self.width, self.y + self.height)
        em = BOLD_CHAR_EM if self.bold else CHAR_EM
        width = max((len(line) for line in self.text), default=0) * em * self.font_size
        height = self.font_size * (1 + 1.15 * (len(self.text) - 1))
        left = {"left": self.x, "center": self.x - width / 2, "right": self.x - width}[self.align]
        top = {"top": self.y, "middle": self.y - height / 2, "bottom": self.y - height,
               "alphabetic": self.y - 0.8 * self.font_size, "line-top": self.y,
               "line-bottom": self.y - height}[self.baseline]
        return (left, top, left + width, top + height)


def _description(text: str | None) -> dict[str, str]:
    """Vega-Lite's aria description of a mark item ("phase: rollout; kind: measured; seconds: 3.2"): its datum."""
    pairs = (part.split(": ", 1) for part in (text or "").split("; ") if ": " in part)
    return {key: value for key, value in pairs}


@dataclass
class Drawing:
    """Every item a chart draws, and the canvas it is drawn on."""

    width: float
    height: float
    items: list[Item]
    png: bytes = b""
    # Each view's plot area: (left, top, right, bottom) on the canvas.
    areas: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)

    def of(self, *, marktype: str | None = None, role: str | None = None, panel: str | None = None) -> list[Item]:
        return [item for item in self.items if (marktype is None or item.marktype == marktype)
                and (role is None or item.role == role) and (panel is None or item.panel == panel)]

    def panels(self) -> list[str]:
        return sorted({item.panel for item in self.items})


def _walk(mark: dict[str, Any], ox: float, oy: float, panel: str, out: list[Item],
          areas: dict[str, tuple[float, float, float, float]]) -> None:
    marktype, role, name = mark.get("marktype", ""), mark.get("role", ""), mark.get("name") or ""
    for item in mark.get("items", []):
        x, y = ox + (item.get("x") or 0.0), oy + (item.get("y") or 0.0)
        if marktype == "group":
            inner = name.removesuffix("_group") if role == "scope" and name else panel
            if inner != panel and item.get("width") and inner not in areas:
                areas[inner] = (x, y, x + item["width"], y + (item.get("height") or 0.0))
            for child in item.get("items", []):
                _walk(child, x, y, inner, out, areas)
            continue
        if item.get("opacity") == 0:  # drawn invisible (an axis label Vega hid so as not to overlap another)
            continue
        text = item.get("text")
        lines = tuple(text) if isinstance(text, list) else (() if text is None else (str(text),))
        out.append(Item(
            marktype=marktype, role=role, name=name, panel=panel, x=x + (item.get("dx") or 0.0),
            y=y + (item.get("dy") or 0.0), width=item.get("width") or 0.0, height=item.get("height") or 0.0,
            x2=None if item.get("x2") is None else ox + item["x2"], y2=None if item.get("y2") is None else oy + item["y2"],
            text=lines, font_size=item.get("fontSize") or 11.0, bold=item.get("fontWeight") in ("bold", 700),
            align=item.get("align") or "left", baseline=item.get("baseline") or "alphabetic",
            angle=item.get("angle") or 0.0, fill=item.get("fill"), stroke=item.get("stroke"),
            datum=_description(item.get("description"))))


def drawn(chart: Any) -> Drawing:
    """Render a chart as `rlplan` writes it (chart_commands.chart_spec, the same vl-convert) and read what it drew."""
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    from rlplan.planner.commands.chart_commands import chart_spec, xml_safe

    spec = xml_safe(chart_spec(chart))
    graph = vl_convert.vegalite_to_scenegraph(spec, vl_version=vl_version_for_vl_convert())
    origin_x, origin_y = graph.get("origin", (0, 0))
    items: list[Item] = []
    areas: dict[str, tuple[float, float, float, float]] = {}
    _walk(graph["scenegraph"], origin_x, origin_y, "root", items, areas)
    png = vl_convert.vegalite_to_png(spec, vl_version=vl_version_for_vl_convert(), scale=1)
    return Drawing(width=graph["width"], height=graph["height"], items=items, png=png, areas=areas)


# --- what a user would see wrong ---------------------------------------------------------------------------------


def bars_off_their_labels(drawing: Drawing, panel: str, x_field: str) -> list[str]:
    """Each bar of the panel must lie inside the band of the x-axis label that names its datum, and inside the
    panel: the bars that do not, said."""
    labels = [item for item in drawing.of(role="axis-label", panel=panel) if item.angle or item.baseline == "top"]
    centres = {item.text[0]: item.x for item in labels}
    positions = sorted(centres.values())
    band = min((b - a for a, b in zip(positions, positions[1:], strict=False)), default=None)
    bars = [item for item in drawing.of(marktype="rect", role="mark", panel=panel) if x_field in item.datum]
    assert bars and centres, f"no bars or labels in {panel}"
    band = band or 2 * max(bar.width for bar in bars)
    wrong = []
    for bar in bars:
        name = bar.datum[x_field]
        centre = centres.get(name)
        if centre is None or not (centre - band / 2 - 0.5 <= bar.x and bar.x + bar.width <= centre + band / 2 + 0.5):
            wrong.append(f"{bar.datum} drawn at x {bar.x:.0f}..{bar.x + bar.width:.0f}, its label "
                         f"{name!r} at {centre}")
    return wrong


def overlapping_texts(drawing: Drawing, roles: tuple[str, ...] | None = None) -> list[str]:
    """Pairs of unrotated texts whose boxes cross (estimated widths), among the given roles (default: all)."""
    texts = [item for item in drawing.of(marktype="text") if not item.angle and item.text
             and any(line.strip() for line in item.text) and (roles is None or item.role in roles)]
    crossing = []
    for index, first in enumerate(texts):
        a = first.box()
        for second in texts[index + 1:]:
            b = second.box()
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                crossing.append(f"{first.role} {first.text} over {second.role} {second.text}")
    return crossing


def texts_across_rules(drawing: Drawing, text_role: str = "mark") -> list[str]:
    """Texts of a role (a mark's values) that a horizontal rule of a mark (a limit line) runs through."""
    rules = [item for item in drawing.of(marktype="rule", role="mark")]
    crossing = []
    for text in drawing.of(marktype="text", role=text_role):
        left, top, right, bottom = text.box()
        for rule in rules:
            rule_left, rule_right = sorted((rule.x, rule.x2 if rule.x2 is not None else rule.x))
            if top <= rule.y <= bottom and left < rule_right and rule_left < right:
                crossing.append(f"{text.text} at y {top:.0f}..{bottom:.0f} crossed by the rule at y {rule.y:.0f}")
    return crossing


def off_the_canvas(drawing: Drawing) -> list[str]:
    """Texts whose (estimated) box runs past the picture's edge: a title cut mid-word. (Legends are left out:
    Vega sizes the canvas to them with its own measure of their text.)"""
    return [f"{item.role} {item.text} spans {item.box()} on a {drawing.width} x {drawing.height} canvas"
            for item in drawing.of(marktype="text") if not item.angle and item.text
            and not item.role.startswith("legend")
            and not (0 <= item.box()[0] and item.box()[2] <= drawing.width
                     and 0 <= item.box()[1] and item.box()[3] <= drawing.height)]


def texts_outside_their_panel(drawing: Drawing) -> list[str]:
    """Texts a mark draws (values, labels) whose box leaves the plot area of the view they belong to."""
    outside = []
    for item in drawing.of(marktype="text", role="mark"):
        area = next((area for name, area in drawing.areas.items() if item.panel.startswith(name)), None)
        left, top, right, bottom = item.box()
        if area is not None and not (area[0] - 1 <= left and right <= area[2] + 1 and area[1] - 1 <= top
                                     and bottom <= area[3] + 1):
            outside.append(f"{item.text} spans {left:.0f}..{right:.0f} x {top:.0f}..{bottom:.0f}, its panel {area}")
    return outside


def ink_on_the_edge(drawing: Drawing, margin: int = 2) -> list[str]:
    """Sides of the PNG with drawn pixels within `margin` of the canvas edge: something runs off the picture (a
    title cut mid-word at the right edge)."""
    from PIL import Image

    image = Image.open(io.BytesIO(drawing.png)).convert("RGBA")
    width, height = image.size
    pixels = image.load()

    def inked(x: int, y: int) -> bool:
        r, g, b, a = pixels[x, y]
        return a > 0 and (r, g, b) != (255, 255, 255)

    sides = {"left": [(x, y) for x in range(margin) for y in range(height)],
             "right": [(x, y) for x in range(width - margin, width) for y in range(height)],
             "top": [(x, y) for y in range(margin) for x in range(width)],
             "bottom": [(x, y) for y in range(height - margin, height) for x in range(width)]}
    return [side for side, points in sides.items() if any(inked(x, y) for x, y in points)]
