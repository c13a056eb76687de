from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self):
        from . import signals  # noqa: F401
