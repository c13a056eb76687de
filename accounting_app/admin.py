from datetime import UTC, datetime

from django.contrib import admin

from accounting_app.models import UsageRecord


def _time(ts):
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Read-only: the records follow the sessions' transitions, never an edit."""

    list_display = ["session_name", "kernel_id", "kind", "user", "project", "scaling_group",
                    "day", "started", "ended", "cpu", "mem", "devices", "stored_bytes",
                    "cpu_used", "mem_peak"]
    list_filter = ["kind", "day", "scaling_group", "domain"]
    list_select_related = ["user", "project", "scaling_group"]
    search_fields = ["session_name", "=kernel_id", "=session_id", "user__username",
                     "project__name"]
    date_hierarchy = "day"
    show_full_result_count = False

    @admin.display(ordering="start_ts")
    def started(self, record):
        return _time(record.start_ts)

    @admin.display(ordering="end_ts")
    def ended(self, record):
        return _time(record.end_ts)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in UsageRecord._meta.fields] + ["started", "ended"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
