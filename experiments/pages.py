"""The HTML pages the experiments write, from the Jinja2 templates in experiments/templates/, autoescaped:
every value is escaped unless it is marked safe (`markup`: the plotly divs and our own CSS)."""
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

ENV = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                  undefined=StrictUndefined, trim_blocks=False, keep_trailing_newline=True)


def render(template: str, **values) -> str:
    """The page `template` (a file in experiments/templates/) filled with `values`."""
    return ENV.get_template(template).render(**values)


def markup(html: str) -> Markup:
    """HTML we made ourselves (a plotly div, a style sheet), inserted as it is."""
    return Markup(html)
