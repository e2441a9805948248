"""The console's pages under ``/console``: routes, pages and actions grouped by what they show, their templates.

:mod:`console.pages.routes` assembles the console (its sign-in and its routes);
:mod:`~console.pages.kit` renders every page with the same headers, token and notices; the
pages are in :mod:`~console.pages.overview_pages` (the front page and its sections),
:mod:`~console.pages.saga_pages`, :mod:`~console.pages.letter_pages`,
:mod:`~console.pages.chart_pages` and :mod:`~console.pages.schedules`; the POST actions in
:mod:`~console.pages.actions`; ``templates/`` holds the Jinja2 templates they render.
"""
