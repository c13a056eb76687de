from django.contrib import admin

from identity_app.models import Domain, KeyPair, Project, ResourcePolicy
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
