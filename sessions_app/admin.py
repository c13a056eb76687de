from django.contrib import admin
from django.utils.html import format_html

from sessions_app import admin_actions
from sessions_app.admin_actions import DestroyActionsMixin
from sessions_app.enums import Status
from sessions_app.manager_state import set_status
from sessions_app.models import (
    BackgroundTask,
    Kernel,
    ManagerState,
    Session,
    SessionEvent,
    SessionTemplate,
)

STATUS_COLORS = {
    Status.PENDING: "#8a6d3b", Status.RUNNING: "#2e7d32", Status.TERMINATED: "#616161",
    Status.CANCELLED: "#616161", Status.ERROR: "#c62828", Status.TERMINATING: "#ef6c00",
    Status.STOPPED: "#57606a",
}


@admin.display(description="status", ordering="status")
def colored_status(obj):
    return format_html('<b style="color:{}">{}</b>', STATUS_COLORS.get(obj.status, "#1565c0"),
                       obj.status)

STATUS_FIELDS = ["status", "status_info", "status_data", "status_history", "status_changed"]


class KernelInline(admin.TabularInline):
    model = Kernel
    fields = ["cluster_role", "cluster_idx", "status", "status_info", "agent", "container_id",
              "exit_code"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


class SessionEventInline(admin.TabularInline):
    model = SessionEvent
    fields = ["created_at", "name", "kernel", "from_status", "to_status", "reason", "actor"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Session)
class SessionAdmin(DestroyActionsMixin, admin.ModelAdmin):
    sessions_of = staticmethod(admin_actions.sessions_of_sessions)
    list_display = ["name", colored_status, "session_type", "image", "user", "scaling_group",
                    "created_at"]
    list_filter = ["status", "session_type", "scaling_group", "kernels__agent"]
    list_select_related = ["user", "scaling_group"]
    search_fields = ["name", "id", "keypair__access_key"]
    readonly_fields = STATUS_FIELDS + ["occupying_slots", "created_at", "starts_at",
                                       "terminated_at", "result"]
    inlines = [KernelInline, SessionEventInline]
    show_full_result_count = False
    actions = [admin_actions.stop_sessions, admin_actions.resume_sessions]


@admin.register(Kernel)
class KernelAdmin(DestroyActionsMixin, admin.ModelAdmin):
    sessions_of = staticmethod(admin_actions.sessions_of_kernels)
    list_display = ["id", "session", "cluster_role", colored_status, "agent", "container_id",
                    "exit_code"]
    list_filter = ["status", "agent"]
    list_select_related = ["session", "agent"]
    search_fields = ["id", "session__name", "container_id"]
    readonly_fields = STATUS_FIELDS + ["occupied_slots", "exit_code", "last_stat",
                                       "terminated_at"]
    show_full_result_count = False


@admin.register(SessionEvent)
class SessionEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "session", "name", "from_status", "to_status", "reason",
                    "actor"]
    list_filter = ["name"]
    readonly_fields = ["session", "kernel", "name", "from_status", "to_status", "reason",
                       "actor", "data", "created_at"]
    list_select_related = ["session"]
    search_fields = ["session__name", "session__id"]
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SessionTemplate)
class SessionTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "project", "created_at", "modified_at"]
    list_select_related = ["user", "project"]
    search_fields = ["name", "user__username"]
    readonly_fields = ["created_at", "modified_at"]


@admin.register(BackgroundTask)
class BackgroundTaskAdmin(admin.ModelAdmin):
    """Commits of sessions as images (sessions_app/commits.py): read-only."""

    list_display = ["created_at", "kind", "user", "session", "state", "current_progress",
                    "total_progress", "message"]
    list_filter = ["kind", "state"]
    list_select_related = ["user", "session"]
    search_fields = ["id", "session__name", "user__username"]
    readonly_fields = ["kind", "user", "session", "state", "current_progress",
                       "total_progress", "message", "result", "created_at", "updated_at",
                       "finished_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ManagerState)
class ManagerStateAdmin(admin.ModelAdmin):
    """The manager's status (frozen: no new sessions) and announcement, one row."""

    list_display = ["status", "changed_at", "changed_by", "announcement_enabled"]
    readonly_fields = ["changed_at", "changed_by"]

    def has_add_permission(self, request):
        return not ManagerState.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        obj.pk = 1  # the one row manager_state reads
        if "status" in form.changed_data:  # through the one place that records who froze it
            set_status(obj.status, actor=request.user)
            obj.refresh_from_db(fields=["status", "changed_at", "changed_by"])
        super().save_model(request, obj, form, change)
