"""The what-if: what each slow rank costs the job, from the replay with it as fast as its peers (its scenarios, peers and self-checks)."""
