from django.contrib import admin

from agents_app.models import Agent, Image, WarmNetwork
from sessions_app import admin_actions


@admin.register(Agent)
class AgentAdmin(admin_actions.DestroyActionsMixin, admin.ModelAdmin):
    sessions_of = staticmethod(admin_actions.sessions_of_agents)
    list_display = ["id", "status", "scaling_group", "schedulable", "available_slots",
                    "occupied_slots", "addr", "last_heartbeat"]
    list_filter = ["status", "scaling_group", "schedulable"]
    list_select_related = ["scaling_group"]
    search_fields = ["id", "addr"]
    readonly_fields = ["occupied_slots", "first_contact", "last_heartbeat", "lost_at",
                       "swarm", "networks"]


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "architecture", "registry"]
    search_fields = ["name"]


@admin.register(WarmNetwork)
class WarmNetworkAdmin(admin.ModelAdmin):
    """Read only: the heartbeats make, claim and remove them (agents_app/network_pool.py)."""
    list_display = ["name", "scaling_group", "internal", "session_id", "claimed_at",
                    "retired", "created_at"]
    list_filter = ["scaling_group", "retired"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
