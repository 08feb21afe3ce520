"""The results pipeline: merging runs into the committed records, comparing and indexing them."""
