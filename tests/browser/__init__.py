"""Browser tests: real JupyterLab + headless chromium (Playwright)."""
