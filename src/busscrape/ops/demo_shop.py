"""The demo site's shop: a product list and four product pages for the demo extractor
(``extractors/demo-product.toml``), one of each kind an extractor meets.

==========================  =================================================================
``/shop/kettle.html``       everything in the server's HTML (price with a decimal comma)
``/shop/lantern.html``      price, availability and reviews rendered by JavaScript from
                            ``/shop/api/lantern.json``: only a browser's DOM has them
``/shop/stove.html``        a JSON-LD ``Product`` (offers, reviews) and almost no markup
``/shop/mystery.html``      no price at all: the required field is missing
==========================  =================================================================
"""

from __future__ import annotations

import json
from html import escape

SHOP_PATHS = ("/shop/", "/shop/kettle.html", "/shop/lantern.html", "/shop/stove.html", "/shop/mystery.html")
PRODUCT_PATHS = SHOP_PATHS[1:]

LANTERN = {"price": "24.50", "currency": "EUR", "availability": "PreOrder",
           "reviews": [{"author": "Noor", "rating": 4, "date": "2025-05-01"},
                       {"author": "Mateo", "rating": 3, "date": "2025-05-09"}]}

STOVE_LD = {
    "@context": "https://schema.org", "@type": "Product", "name": "Camp Stove",
    "offers": {"@type": "Offer", "price": "89.90", "priceCurrency": "USD",
               "availability": "https://schema.org/OutOfStock"},
    "review": [{"@type": "Review", "author": {"@type": "Person", "name": "Iris"},
                "reviewRating": {"@type": "Rating", "ratingValue": "5"}, "datePublished": "2025-01-20"}],
}

EXPECTED = {
    "/shop/kettle.html": {"name": "Trail Kettle", "price": "1299.00", "currency": "EUR", "availability": "InStock",
                          "reviews": [{"author": "Ana", "rating": 5, "date": "2025-03-02"},
                                      {"author": "Bo", "rating": 4, "date": "2025-03-15"}]},
    "/shop/lantern.html": {"name": "Night Lantern", "price": "24.50", "currency": "EUR", "availability": "PreOrder",
                           "reviews": LANTERN["reviews"]},
    "/shop/stove.html": {"name": "Camp Stove", "price": "89.90", "currency": "USD", "availability": "OutOfStock",
                         "reviews": [{"author": "Iris", "rating": 5, "date": "2025-01-20"}]},
}
"""What the demo extractor makes of each page (the mystery box has no record: its price is missing)."""


def _review(author: str, rating: int, day: str) -> str:
    return (f'<div class=review><span class=author>{escape(author)}</span> '
            f'<span class=rating data-rating={rating}>{"★" * rating}</span> <time datetime="{day}">{day}</time></div>')


def shop_pages(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The shop's pages, laid out by the demo site's ``page(title, body, head=...)``."""
    kettle = ('<h1 class=product-name>Trail Kettle</h1><p>Boils a litre in four minutes.</p>'
              '<p><span class=price data-currency=EUR>1.299,00 €</span> · '
              '<span class=availability data-availability=InStock>In stock</span></p>'
              '<section id=reviews>' + _review("Ana", 5, "2025-03-02") + _review("Bo", 4, "2025-03-15") + '</section>')
    lantern_script = """<script>
window.addEventListener('DOMContentLoaded', async () => {
  const p = await (await fetch('/shop/api/lantern.json')).json();
  document.getElementById('offer').innerHTML =
    `<span class=price data-currency=${p.currency}>${p.price}</span> · ` +
    `<span class=availability data-availability=${p.availability}>${p.availability}</span>`;
  document.getElementById('reviews').innerHTML = p.reviews.map(r =>
    `<div class=review><span class=author>${r.author}</span> <span class=rating data-rating=${r.rating}>` +
    `${'★'.repeat(r.rating)}</span> <time datetime="${r.date}">${r.date}</time></div>`).join('');
});</script>"""
    lantern = ('<h1 class=product-name>Night Lantern</h1><p>Warm light for long evenings.</p>'
               '<p id=offer>Loading the price…</p><section id=reviews></section>')
    stove_head = f'<script type="application/ld+json">{json.dumps(STOVE_LD)}</script>'
    stove = "<p>Two burners, folds flat.</p>"
    mystery = ('<h1 class=product-name>Mystery Box</h1><p>Price on request.</p>'
               '<span class=availability data-availability=InStock>In stock</span>')
    listing = "<ul>" + "".join(f'<li><a href="{p}">{p.rsplit("/", 1)[-1].removesuffix(".html").title()}</a></li>'
                              for p in PRODUCT_PATHS) + "</ul>"
    return {
        "/shop/": page("Shop", listing),
        "/shop/kettle.html": page("Trail Kettle", kettle),
        "/shop/lantern.html": page("Night Lantern", lantern, head=lantern_script),
        "/shop/stove.html": page("Camp Stove", stove, head=stove_head),
        "/shop/mystery.html": page("Mystery Box", mystery),
    }
