"""What a run keeps: the result schema (every column, declared once), the records beside the
rows, the files they are written to, and what a run says while it runs."""
