"""The console's pages under ``/console``: routes, pages and actions grouped by what they show, their templates.

:mod:`estafeta_console.pages.routes` assembles the console (its sign-in and its routes);
:mod:`~estafeta_console.pages.kit` renders every page with the same headers, token and notices; the
pages are in :mod:`~estafeta_console.pages.overview_pages` (the front page and its sections),
:mod:`~estafeta_console.pages.saga_pages`, :mod:`~estafeta_console.pages.letter_pages`,
:mod:`~estafeta_console.pages.chart_pages` and :mod:`~estafeta_console.pages.schedules`; the POST actions in
:mod:`~estafeta_console.pages.actions`; ``templates/`` holds the Jinja2 templates they render.
"""
