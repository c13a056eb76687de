from django.contrib import admin, messages
from django.http import HttpResponse

from identity_app.audit import as_json_line
from identity_app.models import AuditEntry, Domain, KeyPair, Project, ResourcePolicy
from sessions_app import admin_actions
from sessions_app.admin_actions import DestroyActionsMixin


@admin.register(KeyPair)
class KeyPairAdmin(DestroyActionsMixin, admin.ModelAdmin):
    sessions_of = staticmethod(admin_actions.sessions_of_keypairs)
    list_display = ["access_key", "user", "is_main", "is_active", "is_admin", "resource_policy",
                    "concurrency_used", "last_used"]
    list_filter = ["is_active", "is_admin", "resource_policy"]
    list_select_related = ["user", "resource_policy"]
    search_fields = ["access_key", "user__username"]
    readonly_fields = ["concurrency_used", "last_used"]
    # Encrypted at rest and shown once, when the keypair is made (save_model).
    exclude = ["secret_key"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            self.message_user(request, f"The secret key of {obj.access_key} is "
                                       f"{obj.secret_key}; it is shown only this once.",
                              messages.WARNING)


@admin.register(Domain)
class DomainAdmin(admin.ModelAdmin):
    list_display = ["name", "is_active", "total_resource_slots"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "domain", "is_active", "total_resource_slots"]
    list_select_related = ["domain"]


@admin.register(ResourcePolicy)
class ResourcePolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "total_resource_slots", "max_concurrent_sessions",
                    "max_pending_session_count", "idle_timeout", "max_session_lifetime"]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: rows are written by the acts themselves and deleted only by the
    retention task (AUDIT_LOG_RETENTION_DAYS)."""

    list_display = ["at", "username", "access_key", "on_behalf_of", "address", "action",
                    "target_type", "target_id", "result", "message"]
    list_filter = ["result", "action", "target_type", ("at", admin.DateFieldListFilter)]
    search_fields = ["username", "access_key", "on_behalf_of", "target_id", "address",
                     "message"]
    date_hierarchy = "at"
    show_full_result_count = False
    actions = ["export_json_lines"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Export selected entries as JSON lines")
    def export_json_lines(self, request, queryset):
        body = "".join(as_json_line(e) + "\n" for e in queryset.order_by("at", "id"))
        response = HttpResponse(body, content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="audit-log.jsonl"'
        return response
