"""Test helpers shared by the unit and e2e tiers (imported as ``helpers.<module>``)."""
