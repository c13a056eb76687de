from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self):
        from . import schema, signals  # noqa: F401 (schema registers its extension)
