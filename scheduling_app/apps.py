from django.apps import AppConfig


class SchedulingAppConfig(AppConfig):
    name = "scheduling_app"
    verbose_name = "Scheduling"
