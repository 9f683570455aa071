DROP TABLE admin_actions;
DROP TABLE login_attempts;
DROP TABLE sessions;
