"""End-to-end validation against published engine measurements (issue 12).

``convert``: published tables -> the long format; ``data``: reading the long format;
``predict``: one prediction per row; ``report``: summaries and the HTML scatter.
"""
