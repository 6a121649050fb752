"""Task files: one reader of BIRD-layout question files, and their conversion into miles jsonl."""
