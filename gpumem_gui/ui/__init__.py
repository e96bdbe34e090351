"""The Qt window: forms read into core models, core results drawn. No estimation logic lives here."""
