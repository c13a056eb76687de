"""Users' roles: superadmins (Django superusers), admins (staff, or a user acting through
an admin keypair) and users, who see and touch only their own things."""


def is_admin(user, keypair=None):
    """Admins are superusers, staff, or users acting through an admin keypair."""
    return bool(user and (user.is_superuser or user.is_staff or (keypair and keypair.is_admin)))


def is_superadmin(user):
    return bool(user and user.is_superuser)
