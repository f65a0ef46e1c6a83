"""StateLM-style context management for agent episodes.

The model manages its own context window with tools: document tools reach a long document it never sees
whole (`tools.py`), memory tools keep notes and delete old messages; the history is numbered and a deleted
message is re-rendered as a stub (`history.py`); `loop.py` runs such a managed episode and turns it into
training samples; `document.py` and `docqa.py` make the document-QA task. Kept import-light on purpose.
"""
