"""Look at stored episodes: ``arborl view STORE_URL`` (browser) and ``arborl store show ID`` (terminal).

:mod:`arborl.view.data` turns episodes, groups, runs' metrics and the capability profile into
JSON-able dicts; :mod:`arborl.view.api` serves them and the page in ``static/`` (plain HTML, JS
and CSS, no build step); :mod:`arborl.view.text` prints one episode with rich. Everything reads:
the store is opened read-only. See docs/viewer.md.
"""
