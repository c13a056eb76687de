from django.contrib import admin

from agents_app.models import Agent, Image
from sessions_app import admin_actions


@admin.register(Agent)
class AgentAdmin(admin_actions.DestroyActionsMixin, admin.ModelAdmin):
    sessions_of = staticmethod(admin_actions.sessions_of_agents)
    list_display = ["id", "status", "scaling_group", "schedulable", "available_slots",
                    "occupied_slots", "addr", "last_heartbeat"]
    list_filter = ["status", "scaling_group", "schedulable"]
    list_select_related = ["scaling_group"]
    search_fields = ["id", "addr"]
    readonly_fields = ["occupied_slots", "first_contact", "last_heartbeat", "lost_at"]


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "architecture", "registry"]
    search_fields = ["name"]
