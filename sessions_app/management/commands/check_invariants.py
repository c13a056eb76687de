from django.core.management.base import BaseCommand, CommandError

from sessions_app.lifecycle.invariants import check_invariants


class Command(BaseCommand):
    help = ("Count the violations of each invariant of ARCHITECTURE.md: containers without "
            "a live kernel, live kernels without a container, slot and concurrency drift, "
            "kernels past their state's timeout, session networks whose session has ended. "
            "Exits 1 when there is any.")

    def handle(self, *args, **options):
        checks = check_invariants()
        for check in checks:
            self.stdout.write(f"{len(check.violations):6d}  {check.name}")
            for line in check.violations[:50]:
                self.stdout.write(f"          {line}")
        total = sum(len(check.violations) for check in checks)
        if total:
            raise CommandError(f"{total} violation(s); `manage.py reconcile_usage` corrects "
                               "drift, agents' heartbeats remove stray containers")
        self.stdout.write("all invariants hold")
