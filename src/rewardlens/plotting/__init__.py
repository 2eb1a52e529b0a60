"""The base layer's plotting rule: every result's `plot(..., ax=None)` draws into the caller's axes, or
into a new figure (`plotting/_axes.py`); and the one owner of the HTML a result shows in a notebook
(`HtmlView`, `result_html`: plotting/_html.py) and of the token view (plotting/_token_html.py), which the
audit report's token section uses too. It imports no other rewardlens module but `errors` (a leaf), and
matplotlib only when a figure is made."""

from ._axes import finish as finish
from ._axes import one_panel as one_panel
from ._axes import panels as panels
from ._html import CompositeView as CompositeView
from ._html import Html as Html
from ._html import HtmlView as HtmlView
from ._html import e as e
from ._html import facts as facts
from ._html import frame_table as frame_table
from ._html import headline as headline
from ._html import interval as interval
from ._html import join as join
from ._html import num as num
from ._html import pair_view as pair_view
from ._html import result_html as result_html
from ._html import svg as svg
from ._html import table as table
from ._html import tag as tag
from ._html import view as view
from ._token_html import TOKEN_ROWS as TOKEN_ROWS
from ._token_html import TokenRow as TokenRow
from ._token_html import token_colour as token_colour
from ._token_html import token_rows as token_rows
from ._token_html import token_spans as token_spans
from ._token_html import token_view as token_view

__all__ = ["TOKEN_ROWS", "CompositeView", "Html", "HtmlView", "TokenRow", "e", "facts", "finish", "frame_table",
           "headline", "interval", "join", "num", "one_panel", "pair_view", "panels", "result_html", "svg", "table",
           "tag", "token_colour", "token_rows", "token_spans", "token_view", "view"]
