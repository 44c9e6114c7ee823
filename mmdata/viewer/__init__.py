"""Looking at a store: static pages for a browser (`pages`) from videos remuxed without re-encoding (`remux`)."""
