from django.apps import AppConfig


class AccountingAppConfig(AppConfig):
    name = "accounting_app"
    verbose_name = "Accounting"
