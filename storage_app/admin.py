from django.contrib import admin

from storage_app.models import Folder, FolderGrant, FolderInvitation


class FolderGrantInline(admin.TabularInline):
    model = FolderGrant
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Folder)
class FolderAdmin(admin.ModelAdmin):
    """Folders and who they are shared with. Deleting a folder here deletes its row only:
    its files are deleted by the owner's delete (API, CLI, dashboard), which also refuses
    while a live session mounts it."""

    list_display = ["name", "owner_label", "scaling_group", "member_permission", "quota",
                    "created_at"]
    list_select_related = ["user", "project", "scaling_group"]
    search_fields = ["name", "user__username", "user__email", "project__name"]
    readonly_fields = ["id", "created_at"]
    inlines = [FolderGrantInline]
    show_full_result_count = False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(FolderInvitation)
class FolderInvitationAdmin(admin.ModelAdmin):
    list_display = ["folder", "inviter", "invitee", "permission", "state", "created_at",
                    "modified_at"]
    list_filter = ["state", "permission"]
    list_select_related = ["folder", "inviter", "invitee"]
    search_fields = ["folder__name", "inviter__username", "invitee__username",
                     "invitee__email"]
    readonly_fields = ["created_at", "modified_at"]
    autocomplete_fields = ["folder", "inviter", "invitee"]


@admin.register(FolderGrant)
class FolderGrantAdmin(admin.ModelAdmin):
    list_display = ["folder", "user", "permission", "created_at"]
    list_filter = ["permission"]
    list_select_related = ["folder", "user"]
    search_fields = ["folder__name", "user__username", "user__email"]
    autocomplete_fields = ["folder", "user"]
