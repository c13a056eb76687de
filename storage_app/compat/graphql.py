"""The manager's GraphQL lists of folders (the SDK's VFolder.paginated_list,
paginated_own_list, paginated_invited_list, paginated_project_list; the CLI's `vfolder
list-own` and friends), added to the schema of sessions_app/compat/graphql.py, which
imports this module to build it (so nothing here imports that one: its paging rules are
restated in `page`).

Visibility is the /folders routes': a user's own folders, their projects', those shared
with them; admins, every folder.
"""

import graphene
from graphql import GraphQLError

from storage_app import folders as domain

MAX_PAGE_SIZE = 100  # the client's own limit, as for the other lists
ORDER = {"name": "name", "created_at": "created_at", "host": "scaling_group__name"}


class VirtualFolder(graphene.ObjectType):
    id = graphene.UUID()
    host = graphene.String()
    quota_scope_id = graphene.String()
    name = graphene.String()
    user = graphene.String()  # the owner's id (a number here, the manager's is a UUID)
    user_email = graphene.String()
    group = graphene.String()
    group_name = graphene.String()
    creator = graphene.String()
    domain_name = graphene.String()
    unmanaged_path = graphene.String()
    usage_mode = graphene.String()
    permission = graphene.String()
    ownership_type = graphene.String()
    max_files = graphene.Int()
    max_size = graphene.Float()  # bytes (the quota); 0: none
    created_at = graphene.DateTime()
    last_used = graphene.DateTime()
    num_files = graphene.Int()
    cur_size = graphene.Float()
    cloneable = graphene.Boolean()
    status = graphene.String()


class VirtualFolderList(graphene.ObjectType):
    items = graphene.List(VirtualFolder, required=True)
    total_count = graphene.Int(required=True)


def as_item(folder, user, admin):
    owner = folder.user
    return VirtualFolder(
        id=folder.pk, host=folder.scaling_group.name, name=folder.name,
        quota_scope_id=(f"project:{folder.project_id}" if folder.project_id
                        else f"user:{folder.user_id}"),
        user=str(folder.user_id) if folder.user_id else None,
        user_email=(owner.email or owner.get_username()) if owner else None,
        group=str(folder.project_id) if folder.project_id else None,
        group_name=folder.project.name if folder.project_id else None,
        creator=(owner.email or owner.get_username()) if owner else "",
        domain_name=folder.project.domain.name if folder.project_id else "default",
        unmanaged_path=None, usage_mode="general",
        permission=domain.access_of(folder, user, admin=admin) or "ro",
        ownership_type="group" if folder.project_id else "user", max_files=0,
        max_size=folder.quota or 0, created_at=folder.created_at, last_used=None,
        num_files=None, cur_size=domain.usage(folder), cloneable=False, status="ready")


def page(info, folders, limit, offset, filter_, order):
    if filter_:
        raise GraphQLError("Filter expressions (--filter) are not supported by this server.")
    if not MAX_PAGE_SIZE >= limit >= 1:
        raise GraphQLError(f"limit must be between 1 and {MAX_PAGE_SIZE}.")
    if offset < 0:
        raise GraphQLError("offset must not be negative.")
    lookups = []
    for part in filter(None, (p.strip() for p in (order or "").split(","))):
        name = part.lstrip("+-").strip()
        if name not in ORDER:
            raise GraphQLError(f"Cannot order by {name!r}; known: {', '.join(sorted(ORDER))}.")
        lookups.append(("-" if part.startswith("-") else "") + ORDER[name])
    folders = folders.order_by(*lookups, "name", "pk")
    user, admin = info.context.user, getattr(info.context, "_is_admin", False)
    return VirtualFolderList(
        items=[as_item(f, user, admin) for f in folders[offset:offset + limit]],
        total_count=folders.count())


def _visible(info):
    request = info.context
    return domain.visible_folders(request.user, admin=getattr(request, "_is_admin", False)) \
        .select_related("project__domain")


PAGE_ARGUMENTS = {"limit": graphene.Int(required=True), "offset": graphene.Int(required=True),
                  "filter": graphene.String(), "order": graphene.String(),
                  "domain_name": graphene.String(), "access_key": graphene.String()}


class FolderQueries(graphene.ObjectType):
    vfolder_list = graphene.Field(VirtualFolderList, group_id=graphene.UUID(),
                                  **PAGE_ARGUMENTS)
    vfolder_own_list = graphene.Field(VirtualFolderList, **PAGE_ARGUMENTS)
    vfolder_invited_list = graphene.Field(VirtualFolderList, **PAGE_ARGUMENTS)
    vfolder_project_list = graphene.Field(VirtualFolderList, **PAGE_ARGUMENTS)

    def resolve_vfolder_list(root, info, limit, offset, filter=None, order=None,
                             domain_name=None, group_id=None, access_key=None):
        folders = _visible(info)
        if group_id is not None:
            # The manager names projects by UUIDs; projects here have numbers, so no
            # project is the one a UUID names.
            raise GraphQLError("Projects here are numbered, not named by UUIDs: list every "
                               "folder, or the project folders (vfolder_project_list).")
        return page(info, folders, limit, offset, filter, order)

    def resolve_vfolder_own_list(root, info, limit, offset, filter=None, order=None,
                                 domain_name=None, access_key=None):
        folders = _visible(info).filter(user=info.context.user)
        return page(info, folders, limit, offset, filter, order)

    def resolve_vfolder_invited_list(root, info, limit, offset, filter=None, order=None,
                                     domain_name=None, access_key=None):
        folders = _visible(info).filter(user__isnull=False, grants__user=info.context.user)
        return page(info, folders, limit, offset, filter, order)

    def resolve_vfolder_project_list(root, info, limit, offset, filter=None, order=None,
                                     domain_name=None, access_key=None):
        folders = _visible(info).filter(project__isnull=False)
        return page(info, folders, limit, offset, filter, order)

