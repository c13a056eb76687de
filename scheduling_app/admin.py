from django.contrib import admin

from scheduling_app.models import Domain, Project, ResourcePolicy, ResourcePreset, ScalingGroup


@admin.register(Domain)
class DomainAdmin(admin.ModelAdmin):
    list_display = ["name", "is_active", "total_resource_slots"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "domain", "is_active", "total_resource_slots"]
    list_select_related = ["domain"]


@admin.register(ScalingGroup)
class ScalingGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "is_active", "scheduler", "agent_selection_strategy",
                    "pending_timeout"]


@admin.register(ResourcePolicy)
class ResourcePolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "total_resource_slots", "max_concurrent_sessions",
                    "max_pending_session_count", "idle_timeout", "max_session_lifetime"]


@admin.register(ResourcePreset)
class ResourcePresetAdmin(admin.ModelAdmin):
    list_display = ["name", "resource_slots", "shared_memory", "scaling_group"]
    list_select_related = ["scaling_group"]
