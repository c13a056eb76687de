"""The answer to a login that django-axes refuses (too many failures for the user name or
from the address): what happened and how long to wait, for the dashboard's and the admin's
login forms alike."""

import math

from axes.helpers import get_client_username, get_cool_off
from django.shortcuts import render


def lockout_response(request, original_response=None, credentials=None):
    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else 0
    response = render(request, "registration/locked_out.html", {
        "username": get_client_username(request, credentials) or "",
        "minutes": math.ceil(seconds / 60)}, status=429)
    if seconds:
        response["Retry-After"] = str(seconds)
    return response
