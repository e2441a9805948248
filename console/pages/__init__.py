"""The console's pages under ``/console``: routes and actions, the schedules page, their templates.

:mod:`console.pages.routes` routes every page and action; :mod:`console.pages.schedules` adds
the schedules page; ``templates/`` holds the Jinja2 templates they render.
"""
