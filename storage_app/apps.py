from django.apps import AppConfig


class StorageAppConfig(AppConfig):
    name = "storage_app"
    verbose_name = "Storage folders"
    default_auto_field = "django.db.models.BigAutoField"
