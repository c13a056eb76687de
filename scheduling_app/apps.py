from celery import signals
from django.apps import AppConfig


class SchedulingAppConfig(AppConfig):
    name = "scheduling_app"
    verbose_name = "Scheduling"

    def ready(self):
        signals.beat_init.connect(_apply_settings_to_beat, weak=False)


def _apply_settings_to_beat(**kwargs):
    """Periods that are settings (IDLE_CHECK_INTERVAL) reach beat when it starts."""
    from scheduling_app.beat import apply_idle_check_interval  # models: after app loading

    apply_idle_check_interval()
