from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self):
        # Models are loaded only now: the schema extension imports them.
        from sessions_app.api import schema  # noqa: F401 (registers its extension)
