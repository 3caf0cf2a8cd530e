"""Run records, NVML / host sampling and trace export. Never imports ipywidgets or plotly."""
