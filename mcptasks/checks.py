"""System checks for the app settings."""
