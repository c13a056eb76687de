from django.contrib import admin

from scheduling_app.models import ResourcePreset, ScalingGroup


@admin.register(ScalingGroup)
class ScalingGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "is_active", "scheduler", "agent_selection_strategy",
                    "pending_timeout"]


@admin.register(ResourcePreset)
class ResourcePresetAdmin(admin.ModelAdmin):
    list_display = ["name", "resource_slots", "shared_memory", "scaling_group"]
    list_select_related = ["scaling_group"]
