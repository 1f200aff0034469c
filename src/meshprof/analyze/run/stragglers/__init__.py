"""The straggler measures: who arrives late, by how much, and who waits for whom."""
