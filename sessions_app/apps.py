from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Compute sessions"

    def ready(self):
        # Models are loaded only now: the schema extension imports them.
        # The lifecycle's receivers answer what the engine and the scheduler announce.
        from sessions_app.api import schema  # noqa: F401 (registers its extension)
        from sessions_app.lifecycle import destroy, networks  # noqa: F401
