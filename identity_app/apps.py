from django.apps import AppConfig


class IdentityAppConfig(AppConfig):
    name = "identity_app"
    verbose_name = "Identity and tenancy"

    def ready(self):
        from identity_app import checks, signals  # noqa: F401 (models are loaded only now)
